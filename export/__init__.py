"""Export (issue 3): ONNX graphs with the SparsegenLin op, ONNX Runtime optimization/quantization, TensorRT; not built yet."""

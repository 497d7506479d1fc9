"""Export (issue 3, not built yet): ONNX with the SparsegenLin op, ONNX Runtime optimization, TensorRT."""

"""Export: torch -> ONNX with the SparsegenLin op of our own domain, ONNX Runtime optimization and int8 quantization,
parity gates, a Triton model repository, a Hugging Face model directory and TensorRT engines (``bertzoo export``;
see exporter.py)."""

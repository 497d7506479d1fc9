"""Serving: ``bertzoo serve`` runs a gRPC server for an exported model (ONNX Runtime on the CPU or CUDA, or its
TensorRT engine) or a checkpoint (PyTorch, CPU or CUDA), with a dynamic batcher in front of the encoder and Prometheus
metrics. See serving/README.md.

Layers, each knowing only the one below: transport (grpc_server, servicer, interceptors) -> core (tasks_service:
validation, tokenization, post-processing; batcher: queue and batches; engine: one batch on a backend) -> backends.
"""

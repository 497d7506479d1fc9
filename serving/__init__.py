"""Serving: ``bertzoo serve`` runs a gRPC server for an exported model (ONNX Runtime on the CPU or CUDA, OpenVINO on
the CPU, or its TensorRT engine) or a checkpoint (PyTorch, CPU or CUDA), with a dynamic batcher in front of the encoder
and Prometheus metrics; every backend is an entry of ``backends.BACKENDS``. See serving/README.md.

Layers, each knowing only the one below: transport (grpc_server, servicer, interceptors) -> core (tasks_service:
validation, tokenization, post-processing; lanes and batcher: queues and batches; engine: one batch on a backend) ->
backends. With ``--frontends`` N > 1 the transport and tasks_service run in front-end processes and the lanes in one
engine process, joined by ZeroMQ hops (frontends, engine_process, engine_link, engine_protocol).
"""

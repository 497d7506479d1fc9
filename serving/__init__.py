"""Serving (issue 4): the gRPC server, dynamic batcher, backends and metrics. Not built yet."""

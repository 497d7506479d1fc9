"""The generated protobuf and gRPC modules of protos/bertzoo/v1/bertzoo.proto, imported from one place.

They are generated when the package is built or installed (setup.py) and never committed, so a checkout that was
not installed has none: the error says how to get them.
"""

from __future__ import annotations

try:
    from ._proto import bertzoo_pb2 as pb2
    from ._proto import bertzoo_pb2_grpc as pb2_grpc
except ImportError as e:  # pragma: no cover - depends on how the package was installed
    raise ImportError(
        "bertzoo's gRPC stubs (bertzoo.serving._proto) are missing. They are generated from protos/ when the package "
        "is built: install it (`pip install .`, or `pip install -e .` in a checkout, again after editing a .proto)."
    ) from e

SERVICE_NAME: str = pb2.DESCRIPTOR.services_by_name["Bertzoo"].full_name  # "bertzoo.v1.Bertzoo"


def answer_fields(message) -> dict:
    """A message as JSON fields with the .proto's field names, zeros and empty fields included: the one answer schema
    `bertzoo client` prints, the HTTP routes answer and the KServe route's ANSWER rows hold."""
    from google.protobuf.json_format import MessageToDict

    return MessageToDict(message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)


__all__ = ["SERVICE_NAME", "answer_fields", "pb2", "pb2_grpc"]

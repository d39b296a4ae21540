"""Old home of the wire schemas, kept as an alias: import them from :mod:`redline.proto`."""

import sys

from redline.proto import (
    grpc_service_pb2,
    grpc_service_pb2_grpc,
    redline_v1_pb2,
    redline_v1_pb2_grpc,
)

for _module in (grpc_service_pb2, grpc_service_pb2_grpc, redline_v1_pb2, redline_v1_pb2_grpc):
    sys.modules[f"{__name__}.{_module.__name__.rsplit('.', 1)[1]}"] = _module

__all__ = ["grpc_service_pb2", "grpc_service_pb2_grpc", "redline_v1_pb2", "redline_v1_pb2_grpc"]

"""What Triton's gRPC stream says of one response: whether it is its request's last.

A decoupled model's responses carry the `triton_final_response` parameter; a response
without it (a model that is not decoupled) is its request's only one. The load test's
stream clients and the gateway's gRPC relay both need to know where a request ends.
"""

from __future__ import annotations

from tritonclient.grpc import service_pb2


def is_final_response(response: service_pb2.ModelInferResponse) -> bool:
    flag = response.parameters.get("triton_final_response")
    return flag is None or flag.bool_param

"""Reading request tensors and building responses."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def optional_array(request, name: str) -> np.ndarray | None:
    """The input as a flat numpy array, or None when the client left it out."""
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy().reshape(-1)


def required_array(request, name: str) -> np.ndarray:
    array = optional_array(request, name)
    if array is None:
        raise ValueError(f"input '{name}' is required")
    return array


def one_batch_entry(request, name: str) -> np.ndarray:
    """A required input of a max_batch_size > 0 model that must be one entry of shape [1, N]."""
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        raise ValueError(f"input '{name}' is required")
    array = tensor.as_numpy()
    if array.ndim != 2 or array.shape[0] != 1:
        raise ValueError(f"input '{name}' must be one batch entry of shape [1, N], got {list(array.shape)}")
    return array.reshape(-1)


def arrays_of(request, names: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Every input in `names` that the request carries."""
    arrays = {}
    for name in names:
        array = optional_array(request, name)
        if array is not None:
            arrays[name] = array
    return arrays


def response(arrays: Mapping[str, np.ndarray], batched: bool = False) -> pb_utils.InferenceResponse:
    """A response of these outputs; `batched` adds the batch dimension of a max_batch_size > 0 model."""
    return pb_utils.InferenceResponse(
        output_tensors=[pb_utils.Tensor(k, v.reshape(1, -1) if batched else v) for k, v in arrays.items()]
    )


def error_response(
    message: str, cancelled: bool = False, unavailable: bool = False
) -> pb_utils.InferenceResponse:
    """A TritonError response: INVALID_ARG (HTTP 400) unless cancelled, or UNAVAILABLE (503)
    for an overloaded server."""
    code = pb_utils.TritonError.INVALID_ARG
    if cancelled:
        code = pb_utils.TritonError.CANCELLED
    elif unavailable:
        code = pb_utils.TritonError.UNAVAILABLE
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code))


def response_arrays(inference_response, names: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Outputs of a BLS response, raising its error as a RuntimeError."""
    if inference_response.has_error():
        raise RuntimeError(inference_response.error().message())
    arrays = {}
    for name in names:
        tensor = pb_utils.get_output_tensor_by_name(inference_response, name)
        if tensor is not None:
            arrays[name] = tensor.as_numpy()
    return arrays


def bls_request(
    model_name: str, arrays: Mapping[str, np.ndarray], outputs: tuple[str, ...], batched: bool = False
):
    """A BLS request; `batched` adds the batch dimension a max_batch_size > 0 model expects."""
    return pb_utils.InferenceRequest(
        model_name=model_name,
        requested_output_names=list(outputs),
        inputs=[pb_utils.Tensor(k, v.reshape(1, -1) if batched else v) for k, v in arrays.items()],
    )

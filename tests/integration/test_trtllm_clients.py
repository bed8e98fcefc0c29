"""Clients written for TensorRT-LLM's ensemble: the tensors GenAI-Perf's Triton mode sends.

GenAI-Perf (`--service-kind triton --backend tensorrtllm --streaming`) turns each prompt
into `text_input`, `max_tokens`, `exclude_input_in_output` and `stream`, each one value
per request (genai_perf/inputs/converters/tensorrtllm_converter.py; with
`--output-tokens-mean-deterministic`, `min_length` equal to `max_tokens` too), and reads
`text_output` from every response of the gRPC stream. perf_analyzer, the binary it
drives, is not on PyPI, so the payload is sent here the way it would send it.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import INFOBENCH_PROMPT, SEA_PROMPT, GrpcStream, grpc_generate

pytestmark = pytest.mark.integration


def genai_perf_payload(prompt: str, max_tokens: int, exclude_input: bool = True) -> dict:
    return {
        "text_input": np.array([prompt.encode()], dtype=np.object_),
        "max_tokens": np.array([max_tokens], dtype=np.int32),
        "exclude_input_in_output": np.array([exclude_input]),
        "stream": np.array([True]),
    }


def _streamed(url: str, payload: dict) -> tuple[list[str], dict]:
    """A streamed request's text pieces, the final response's included, and that response."""
    stream = GrpcStream(url)
    try:
        stream.send("genai-perf", payload)
        pieces = []
        while True:
            _, outputs, final, error = stream.next()
            assert error is None
            pieces.append(outputs["text_output"][0])
            if final:
                return pieces, outputs
    finally:
        stream.close()


def test_genai_perfs_tensorrt_llm_payload_streams_text_output(server):
    whole, error = grpc_generate(
        server.grpc_url,
        {
            "text_input": np.array([INFOBENCH_PROMPT.encode()], dtype=np.object_),
            "max_tokens": np.array([16], np.int32),
        },
    )
    assert error is None
    pieces, _ = _streamed(server.grpc_url, genai_perf_payload(INFOBENCH_PROMPT, 16))
    assert len(pieces) > 2 and pieces[-1] == ""
    assert "".join(pieces) == whole["text_output"][0]


def test_asking_for_the_prompt_in_the_output_is_refused(server):
    _, error = grpc_generate(server.grpc_url, genai_perf_payload(INFOBENCH_PROMPT, 4, exclude_input=False))
    assert error is not None and "exclude_input_in_output=false is not supported" in error




def test_genai_perfs_deterministic_lengths_hold_end_of_sequence_back(server):
    free_pieces, free = _streamed(server.grpc_url, genai_perf_payload(SEA_PROMPT, 24))
    assert free["num_output_tokens"][0] < 24, "the prompt's answer ends by itself sooner"
    payload = {**genai_perf_payload(SEA_PROMPT, 24), "min_length": np.array([24], dtype=np.int32)}
    pieces, held = _streamed(server.grpc_url, payload)
    assert held["num_output_tokens"][0] == 24 and "".join(pieces).startswith("".join(free_pieces))

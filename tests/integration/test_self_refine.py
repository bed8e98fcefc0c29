"""Self-refinement through the real server: `self_refine` answers an infobench prompt with a
second, refining pass (counted with the first), streams only that pass, and leaves other
prompts and requests without it as they were."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import INFOBENCH_PROMPT, MMLU_PROMPT, GrpcStream, grpc_generate

from specbatch.serving.scheduler.tasks import REFINE_TEMPLATE

pytestmark = pytest.mark.integration

MAX_TOKENS = 12
TOKENS = ("num_input_tokens", "num_output_tokens")  # exact under greedy decoding, however batched


def inputs(**extra: np.ndarray) -> dict[str, np.ndarray]:
    """An infobench and an mmlu prompt, greedy, 12 tokens each."""
    return {
        "text_input": np.array([INFOBENCH_PROMPT.encode(), MMLU_PROMPT.encode()], dtype=np.object_),
        "max_tokens": np.array([MAX_TOKENS], dtype=np.int32),
        "temperature": np.array([0.0], dtype=np.float32),
        **extra,
    }


def streamed(server, request: dict[str, np.ndarray]) -> tuple[str, dict]:
    """The infobench prompt's deltas joined, and the final response's outputs."""
    stream, text = GrpcStream(server.grpc_url), ""
    try:
        stream.send("refine", request)
        while True:
            _, outputs, final, error = stream.next()
            assert error is None
            if final:
                return text, outputs
            if outputs["index"] == [0]:
                text += outputs["text_output"][0]
    finally:
        stream.close()


def test_a_self_refined_prompt_is_answered_by_its_second_pass_with_both_counted(server, tiny_pair_dir):
    from specbatch.decoding import Engine, GenerationRequest, load_model_pair

    plain, error = grpc_generate(server.grpc_url, inputs())
    assert error is None
    off, error = grpc_generate(server.grpc_url, inputs(self_refine=np.array([False])))
    assert error is None
    refined, error = grpc_generate(server.grpc_url, inputs(self_refine=np.array([True])))
    assert error is None

    # greedy: the second pass is the target's own continuation of the refining prompt
    refining_prompt = REFINE_TEMPLATE.format(prompt=INFOBENCH_PROMPT, draft_text=plain["text_output"][0])
    pair = load_model_pair(str(tiny_pair_dir / "target"), str(tiny_pair_dir / "draft"), device="cpu")
    [second] = Engine(pair).generate(
        [GenerationRequest(prompt=refining_prompt, max_new_tokens=MAX_TOKENS)], mode="target_only"
    )
    assert refined["text_output"][0] == second.text != plain["text_output"][0]
    assert refined["task"] == plain["task"] == ["infobench", "mmlu"]
    assert refined["error"] == ["", ""]
    assert refined["num_input_tokens"][0] == plain["num_input_tokens"][0] + second.num_input_tokens
    assert refined["num_output_tokens"][0] == plain["num_output_tokens"][0] + second.num_output_tokens
    assert refined["total_draft_tokens"][0] > plain["total_draft_tokens"][0] > 0
    accepted, drafted = refined["total_accepted_draft_tokens"][0], refined["total_draft_tokens"][0]
    assert refined["acceptance_rate"][0] == pytest.approx(accepted / drafted)

    # the mmlu prompt ignores it; a request with self_refine=false is a plain request
    for name in ("text_output", "finish_reason", *TOKENS):
        assert refined[name][1] == plain[name][1], name
        assert off[name] == plain[name], name

    # a streaming client sees the refined pass only, then the same counters
    text, final = streamed(server, inputs(self_refine=np.array([True]), stream=np.array([True])))
    assert text == refined["text_output"][0]
    assert [final[name][0] for name in TOKENS] == [refined[name][0] for name in TOKENS]

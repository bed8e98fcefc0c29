"""Streaming text deltas, the cancellation board, pending requests and latency accounting."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from specbatch.serving.cancellation import CancelBoard
from specbatch.serving.detokenize import IncrementalDetokenizer
from specbatch.serving.intake import RequestIntake, RoutedRequest
from specbatch.serving.latency import PromptTiming, SlaTargets
from specbatch.serving.outcomes import PromptOutcome
from specbatch.serving.params import ServingLimits
from specbatch.serving.pending import PendingRequests

TEXT = "Grüße aus Zürich — naïve café, 東京 and 🙂 emoji;  double  spaces\nnew line"


@pytest.fixture(scope="module")
def tokenizer(tiny_pair_dir):
    return AutoTokenizer.from_pretrained(tiny_pair_dir / "target")


def test_deltas_rebuild_the_text_exactly_without_broken_characters(tokenizer):
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    assert tokenizer.decode(ids) == TEXT
    detok = IncrementalDetokenizer(lambda chunk: tokenizer.decode(chunk, skip_special_tokens=True))
    deltas = [detok.push([token]) for token in ids]
    deltas.append(detok.finish(tokenizer.decode(ids)))
    assert "".join(deltas) == TEXT
    assert not any("\ufffd" in d for d in deltas)
    assert sum(1 for d in deltas if d) > 10, "text arrived in one piece instead of streaming"


def test_multibyte_characters_are_held_until_complete(tokenizer):
    ids = tokenizer.encode("🙂", add_special_tokens=False)
    detok = IncrementalDetokenizer(lambda chunk: tokenizer.decode(chunk))
    pieces = [detok.push([t]) for t in ids]
    assert "".join(pieces) == "🙂" and all(p in ("", "🙂") for p in pieces)


def test_cancel_board_marks_and_clears_rows(tmp_path):
    board = CancelBoard(tmp_path / "board")
    assert not board.is_cancelled("3-1")
    board.cancel("3-1")
    assert board.is_cancelled("3-1") and not board.is_cancelled("3-2") and not board.is_cancelled("")
    board.clear("3-1")
    assert not board.is_cancelled("3-1")
    board.cancel("4-0")
    board.reset()
    assert not board.is_cancelled("4-0")
    with pytest.raises(ValueError, match="plain name"):
        board.cancel("../escape")


def test_pending_requests_report_cancellation_once_and_forget_finished():
    pending = PendingRequests()
    flags = {"a": False, "b": False}
    done = {"a": False, "b": False}
    pending.add(1, [(1, 0), (1, 1)], lambda: flags["a"], lambda: done["a"])
    pending.add(2, [(2, 0)], lambda: flags["b"], lambda: done["b"])
    assert pending.cancelled() == []
    flags["a"] = True
    done["b"] = True
    assert pending.cancelled() == [(1, 0), (1, 1)]
    assert pending.cancelled() == [] and len(pending) == 0


def test_latency_and_sla_violations():
    timing = PromptTiming(
        arrival_s=10.0, done_s=12.0, dispatched_s=10.5, first_token_s=11.0, output_tokens=11
    )
    assert (timing.queue_s, timing.ttft_s, timing.e2e_s) == (0.5, 1.0, 2.0)
    assert timing.tpot_s == pytest.approx(0.1)
    assert SlaTargets(ttft_s=0.5, tpot_s=0.2, e2e_s=1.5).violations(timing) == ["ttft", "e2e"]
    assert PromptTiming(arrival_s=0.0, done_s=1.0).ttft_s is None
    assert SlaTargets(ttft_s=0.1).violations(PromptTiming(arrival_s=0.0, done_s=1.0)) == []


def test_streaming_intake_sends_every_prompts_text_as_deltas():
    graph = (
        "You are given a directed graph with 2 nodes (numbered 0 to 1) and the following edges:\n"
        "Edges (source -> target, weight):\n0 -> 1, weight: 4\n"
        "Find the top 1 shortest path(s) from node 0 to node 1.\n"
        "Call submit_paths(paths=[[...]], weights=[...])."
    )
    intake = RequestIntake(
        ServingLimits(max_tokens_cap=32, default_max_tokens=8), lambda t: 5, 64, lambda: 1.0
    )
    deltas: list[tuple[int, str, str]] = []
    done: list = []
    request = RoutedRequest(
        prompts=["Instruction: hi\nQuestion: \nGeneration:", graph],
        tasks=["infobench", "graph"],
        predicted_tokens=[8, 1],
        stream=True,
    )
    [job] = intake.admit(
        request,
        lambda outcomes, timings: done.append((outcomes, timings)),
        lambda i, task, text: deltas.append((i, task, text)),
    )
    assert deltas == [(1, "graph", "submit_paths(paths=[[0, 1]], weights=[4])")]
    job.on_delta("Hel")
    job.on_delta("lo")
    job.on_done(PromptOutcome("Hello!", task="infobench", num_output_tokens=3))
    assert deltas[1:] == [(0, "infobench", "Hel"), (0, "infobench", "lo"), (0, "infobench", "!")]
    [(outcomes, timings)] = done
    assert [o.text for o in outcomes] == ["Hello!", "submit_paths(paths=[[0, 1]], weights=[4])"]
    assert timings[0].output_tokens == 3

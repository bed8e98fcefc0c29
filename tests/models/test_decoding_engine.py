"""Engine behaviour the server relies on: validation, stopping, streaming, cancellation,
KV accounting, lookahead adaptation, choice scoring and pair loading."""

from __future__ import annotations

import functools
import math
import re
import subprocess
import sys
import time

import pytest
import torch
from pairs import SMALL_SPEC, attract_to_padding, letters_tokenizer, make_pair, prompts

from specbatch.decoding import (
    Engine,
    GenerationRequest,
    IncompatiblePairError,
    ModelPair,
    UnrunnableRequestError,
    load_model_pair,
    pair_from_models,
    scoring,
)
from specbatch.decoding.engine import STEP_SECONDS_SMOOTHING
from specbatch.decoding.tiny import random_qwen3


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"prompt": ""}, "empty"),
        ({"prompt": []}, "empty"),
        ({"prompt": [1, 10**6]}, "out of range"),
        ({"prompt": None}, "prompt must be"),
        ({"prompt": ["a", "b"]}, "prompt must be"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"max_new_tokens": 10_000}, "context"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": math.nan}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"stop": "x"}, "stop"),
        ({"stop": [""]}, "stop"),
    ],
)
def test_validate_rejects_bad_requests_with_a_clear_message(change: dict, message: str, pair) -> None:
    engine = Engine(pair)
    request = GenerationRequest(**{"prompt": "hello there", **change})
    with pytest.raises(UnrunnableRequestError, match=message):
        engine.validate(request)
    with pytest.raises(ValueError, match=message):
        engine.generate([request])


def test_validate_accepts_a_good_request_and_generate_refuses_unknown_modes(pair) -> None:
    engine = Engine(pair)
    engine.validate(GenerationRequest("hello there", max_new_tokens=5, temperature=0.7, top_p=0.9, top_k=10))
    with pytest.raises(ValueError, match="mode"):
        engine.generate([GenerationRequest("hi")], mode="beam")
    assert engine.generate([]) == []


def test_speculative_mode_needs_a_draft(pair) -> None:
    target_only = pair_from_models(pair.hf_target, None, pair.tokenizer)
    engine = Engine(target_only)
    with pytest.raises(ValueError, match="draft"):
        engine.generate([GenerationRequest("hi")])
    assert (
        engine.generate([GenerationRequest("hi", max_new_tokens=3)], mode="target_only")[0].num_output_tokens
        == 3
    )


def free_run_and_a_pair_that_stops(pair: ModelPair) -> tuple[list, list, ModelPair, int]:
    """Six prompts, their free run of 30 tokens, and the same pair with a token of the first
    row's free run (its sixth) declared as end-of-sequence."""
    rows = prompts(6, pair.vocab_size, seed=21)
    reference = Engine(pair).generate(
        [GenerationRequest(p, max_new_tokens=30) for p in rows], mode="target_only"
    )
    stopping = make_pair("controlled", epsilon=0.3, keep_eos=True)
    eos = reference[0].tokens[5]
    stopping.eos_token_ids.clear()
    stopping.eos_token_ids.add(eos)
    return rows, reference, stopping, eos


@pytest.mark.parametrize("mode", ["speculative", "target_only"])
def test_rows_stop_at_eos_with_the_eos_token_last(mode: str, pair) -> None:
    # a token the free run produced is end-of-sequence; rows must stop right there
    rows, reference, stopping, eos = free_run_and_a_pair_that_stops(pair)
    results = Engine(stopping, lookahead=4).generate(
        [GenerationRequest(p, max_new_tokens=30) for p in rows], mode=mode
    )
    for free_result, result in zip(reference, results, strict=True):
        if eos in free_result.tokens:
            cut = free_result.tokens.index(eos) + 1
            assert result.tokens == free_result.tokens[:cut]
            assert result.finish_reason == "stop"
        else:
            assert result.tokens == free_result.tokens
            assert result.finish_reason == "length"


@pytest.mark.parametrize("mode", ["speculative", "target_only"])
def test_stop_token_ids_end_their_rows_at_the_first_such_token_even_past_ignore_eos(mode: str, pair) -> None:
    rows = prompts(6, pair.vocab_size, seed=5, min_len=3, max_len=20)
    free = Engine(pair, lookahead=4).generate([GenerationRequest(p, max_new_tokens=30) for p in rows])
    stop = free[0].tokens[5]  # a token row 0 makes sixth; the others may make it or not
    asks = [index % 3 != 2 for index in range(len(rows))]
    results = Engine(pair, lookahead=4).generate(
        [
            GenerationRequest(p, max_new_tokens=30, stop_token_ids=[stop] if a else [], ignore_eos=True)
            for p, a in zip(rows, asks, strict=True)
        ],
        mode=mode,
    )
    for free_result, result, asked in zip(free, results, asks, strict=True):
        if asked and stop in free_result.tokens:
            assert result.tokens == free_result.tokens[: free_result.tokens.index(stop) + 1]
            assert result.finish_reason == "stop"
        else:
            assert (result.tokens, result.finish_reason) == (free_result.tokens, "length")
    assert results[0].num_output_tokens <= 6


def test_stop_token_ids_outside_the_vocabulary_are_refused(pair) -> None:
    with pytest.raises(UnrunnableRequestError, match="stop_token_ids"):
        Engine(pair).validate(GenerationRequest([5, 6], stop_token_ids=[pair.vocab_size]))


@pytest.mark.parametrize("mode", ["speculative", "target_only"])
def test_a_row_that_ignores_eos_runs_to_its_budget_beside_rows_that_stop(mode: str, pair) -> None:
    rows, reference, stopping, eos = free_run_and_a_pair_that_stops(pair)
    ignoring = [index % 2 == 0 for index in range(len(rows))]
    results = Engine(stopping, lookahead=4).generate(
        [GenerationRequest(p, max_new_tokens=30, ignore_eos=i) for p, i in zip(rows, ignoring, strict=True)],
        mode=mode,
    )
    assert eos in reference[0].tokens[:-1], "row 0 meets its end-of-sequence before its budget"
    for free_result, result, ignores in zip(reference, results, ignoring, strict=True):
        if ignores or eos not in free_result.tokens:
            assert result.tokens == free_result.tokens, "the target's own tokens, end-of-sequence included"
            assert (result.finish_reason, result.num_output_tokens) == ("length", 30)
        else:
            assert result.tokens == free_result.tokens[: free_result.tokens.index(eos) + 1]
            assert result.finish_reason == "stop"


def test_a_stop_string_completed_within_min_tokens_does_not_end_the_row() -> None:
    pair = make_pair("same", dtype=torch.float64)
    engine = Engine(pair, lookahead=3)
    prompt = [40, 41, 42]
    free = engine.generate([GenerationRequest(prompt, max_new_tokens=24)], mode="target_only")[0]
    decode = functools.partial(pair.tokenizer.decode, skip_special_tokens=True)
    full_text = decode(free.tokens)
    # a stop string the text holds once, completed by token `completed` of 24
    stop = next(
        full_text[i : i + 3] for i in range(len(full_text) // 3) if full_text.count(full_text[i : i + 3]) == 1
    )
    completed = next(k for k in range(1, 25) if stop in decode(free.tokens[:k]))
    for mode in ("speculative", "target_only"):
        held = engine.generate(
            [GenerationRequest(prompt, max_new_tokens=24, stop=[stop], min_tokens=completed)], mode=mode
        )[0]
        assert (held.finish_reason, held.tokens) == ("length", free.tokens)
        assert stop in held.text
        cut = engine.generate(
            [GenerationRequest(prompt, max_new_tokens=24, stop=[stop], min_tokens=completed - 1)], mode=mode
        )[0]
        assert cut.finish_reason == "stop" and cut.text == full_text[: full_text.index(stop)]


def test_stop_strings_end_the_row_and_are_not_in_the_text() -> None:
    pair = make_pair("same", dtype=torch.float64)
    engine = Engine(pair, lookahead=3)
    prompt = [40, 41, 42]
    free = engine.generate([GenerationRequest(prompt, max_new_tokens=24)], mode="target_only")[0]
    full_text = pair.tokenizer.decode(free.tokens, skip_special_tokens=True)
    stop = full_text[len(full_text) // 2 : len(full_text) // 2 + 3]
    assert stop and stop in full_text
    for mode in ("speculative", "target_only"):
        result = engine.generate(
            [GenerationRequest(prompt, max_new_tokens=24, stop=[stop, "never-seen"])], mode=mode
        )[0]
        assert result.finish_reason == "stop"
        assert result.text == full_text[: full_text.index(stop)]
        assert stop not in result.text
        assert result.tokens == free.tokens[: result.num_output_tokens]
        text_before_last = pair.tokenizer.decode(result.tokens[:-1], skip_special_tokens=True)
        assert stop not in text_before_last and stop in pair.tokenizer.decode(
            result.tokens, skip_special_tokens=True
        )


def test_step_callback_delivers_exactly_the_tokens_in_order_once_per_step(pair) -> None:
    rows = prompts(4, pair.vocab_size, seed=3)
    streamed: dict[int, list[int]] = {i: [] for i in range(4)}
    steps: list[list[int]] = []

    def on_step(updates: dict[int, list[int]]) -> None:
        steps.append(sorted(updates))
        for row, tokens in updates.items():
            streamed[row].extend(tokens)

    results = Engine(pair, lookahead=3).generate(
        [GenerationRequest(p, max_new_tokens=n) for p, n in zip(rows, [5, 9, 14, 20], strict=True)],
        on_step=on_step,
    )
    assert [streamed[i] for i in range(4)] == [r.tokens for r in results]
    assert steps[0] == [0, 1, 2, 3], "the prefill step gives every row its first token"
    assert sum(1 for s in steps if 3 in s) > 1
    assert steps[-1] == [3], "finished rows leave the batch"


def test_cancelled_rows_leave_without_disturbing_the_others(pair) -> None:
    rows = prompts(4, pair.vocab_size, seed=3)
    requests = [GenerationRequest(p, max_new_tokens=16) for p in rows]
    engine = Engine(pair, lookahead=2)
    reference = engine.generate(requests)
    steps = {"n": 0}

    def on_step(updates: dict[int, list[int]]) -> None:
        steps["n"] += 1

    results = engine.generate(
        requests, on_step=on_step, is_cancelled=lambda row: row == 1 and steps["n"] >= 2
    )
    assert results[1].finish_reason == "cancelled"
    assert 0 < results[1].num_output_tokens < 16
    assert results[1].tokens == reference[1].tokens[: results[1].num_output_tokens]
    for i in (0, 2, 3):
        assert results[i].tokens == reference[i].tokens
        assert results[i].finish_reason == "length"


def test_result_counters_and_kv_accounting(pair) -> None:
    engine = Engine(pair, lookahead=4, block_size=4)
    seen: list[int] = []
    results = engine.generate(
        [GenerationRequest("hello world", max_new_tokens=10), GenerationRequest([5, 6, 7], max_new_tokens=4)],
        on_step=lambda updates: seen.append(engine.pool.num_held),
    )
    assert results[0].num_input_tokens == len(pair.tokenizer.encode("hello world"))
    assert results[1].num_input_tokens == 3
    assert [r.num_output_tokens for r in results] == [10, 4]
    for r in results:
        assert r.total_draft_tokens > 0
        assert 0 <= r.total_accepted_draft_tokens <= r.total_draft_tokens
        assert r.acceptance_rate == r.total_accepted_draft_tokens / r.total_draft_tokens
    assert min(seen) > 0
    assert seen[-1] < max(seen), "a finished row's blocks are released at once"
    load = engine.snapshot()
    assert load.blocks_free == load.blocks_total == engine.pool.num_blocks
    assert load.running == load.waiting == 0 and load.held_tokens == 0
    assert load.max_rows == engine.max_rows
    assert load.step_seconds > 0 and load.seconds_per_token > 0
    assert load.step_seconds_total > load.step_seconds, "every step's seconds are counted"
    assert load.prefill_seconds_per_token > 0, "the fitted prefill cost reaches the scheduler"
    peaks = engine.memory_peaks
    assert peaks.reserved_tokens >= peaks.held_tokens_at_peak > 0
    assert sum(engine.lookahead_steps.values()) > 0 and 0 <= engine.acceptance <= 1
    by_batch, tokens_per_row_step = load.batch_steps, engine.tokens_per_row_step
    assert sum(by_batch.seconds) == pytest.approx(load.step_seconds_total), "per batch size, the same steps"
    assert sum(by_batch.row_steps) == sum(tokens_per_row_step.values())
    assert sum(by_batch.tokens) == sum(n * count for n, count in tokens_per_row_step.items())
    assert by_batch.steps[0] > 0 and by_batch.row_steps[:2] == (by_batch.steps[0], 2 * by_batch.steps[1])
    assert 0 < sum(by_batch.prefill_tokens) <= 2 * sum(r.num_input_tokens for r in results)
    # a step's rows times its longest context: at least each step's rows times one token
    assert all(slots >= rows for slots, rows in zip(by_batch.context_slots, by_batch.row_steps, strict=True))
    assert sum(by_batch.context_slots) > sum(by_batch.row_steps)
    assert engine.generate([GenerationRequest("x")], mode="target_only")[0].acceptance_rate == 0.0


def test_the_pool_is_sized_by_the_budget_and_refuses_rows_that_can_never_fit(pair) -> None:
    budget = 10 * 16 * pair.kv_bytes_per_token
    engine = Engine(pair, kv_memory_budget_bytes=budget, block_size=16)
    assert engine.snapshot().blocks_total == 10
    assert engine.snapshot().free_tokens == 160
    with pytest.raises(UnrunnableRequestError, match="KV blocks"):
        engine.validate(GenerationRequest([5] * 100, max_new_tokens=60))
    with pytest.raises(ValueError, match="no block"):
        Engine(pair, kv_memory_budget_bytes=pair.kv_bytes_per_token)


def test_draft_only_runs_the_draft_model_greedily(pair) -> None:
    draft_alone = pair_from_models(pair.hf_draft, None, pair.tokenizer)
    draft_alone.eos_token_ids.clear()
    rows = prompts(3, pair.vocab_size, seed=6)
    requests = [GenerationRequest(p, max_new_tokens=8) for p in rows]
    expected = Engine(draft_alone).generate(requests, mode="target_only")
    got = Engine(pair).generate(requests, mode="draft_only")
    assert [r.tokens for r in got] == [r.tokens for r in expected]


def test_the_engine_refuses_an_unknown_lookahead(pair) -> None:
    with pytest.raises(ValueError, match="lookahead"):
        Engine(pair, lookahead="sometimes")


def test_score_choices_picks_the_label_the_target_likes_best(pair) -> None:
    engine = Engine(pair)
    questions = ["Question: which one? Answer:", "Choices:\nA. heart\nB. liver\nAnswer:"]
    single = [[" A", " B", " C", " D"], [" A", " B"]]
    multi = [[" A heart", " B", " C liver disease"], [" A", " B"]]
    for labels in (single, multi):
        scores = engine.score_choices(questions, labels)
        for question, row, result in zip(questions, labels, scores, strict=True):
            ids = pair.tokenizer.encode(question)
            for label in row:
                label_ids = pair.tokenizer.encode(label)
                with torch.no_grad():
                    logits = pair.hf_target(torch.tensor([ids + label_ids])).logits[0].double()
                logprobs = torch.log_softmax(logits, -1)
                expected = sum(float(logprobs[len(ids) - 1 + j, t]) for j, t in enumerate(label_ids))
                assert result.logprobs[label] == pytest.approx(expected, abs=1e-4)
            assert result.best == max(result.logprobs, key=result.logprobs.get)
    with pytest.raises(ValueError, match="labels"):
        engine.score_choices(["q"], [[]])
    with pytest.raises(ValueError, match="label lists"):
        engine.score_choices(["q", "r"], [[" A"]])


def test_labels_that_differ_in_their_last_token_share_one_row_per_prompt(pair, monkeypatch) -> None:
    """ " A", " B", ... tokenize here as a space and the letter: the prompt and the space are
    fed once, not once per label; labels of different shapes still get a row each."""
    fed = []
    forward = scoring._forward_logprobs

    def counting(pair, rows, reads):
        fed.append([len(row) for row in rows])
        return forward(pair, rows, reads)

    monkeypatch.setattr(scoring, "_forward_logprobs", counting)
    question = "Choices:\nA. heart\nB. liver\nAnswer:"
    prompt = len(pair.tokenizer.encode(question, add_special_tokens=False))
    a, b = (pair.tokenizer.encode(label, add_special_tokens=False) for label in (" A", " B"))
    assert len(a) == len(b) == 2 and a[0] == b[0]
    Engine(pair).score_choices([question, question], [[" A", " B", " C", " D"], [" A heart", " B"]])
    assert fed == [[prompt + 1, prompt + 5, prompt + 2]]


def test_pairs_with_different_vocabularies_are_refused(tmp_path, monkeypatch, tokenizer) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    bpe, letters = tokenizer, letters_tokenizer(40)
    target = random_qwen3(SMALL_SPEC, len(bpe), 1, bpe, seed=1)
    target.save_pretrained(tmp_path / "t")
    bpe.save_pretrained(tmp_path / "t")
    other = random_qwen3(SMALL_SPEC, len(bpe), 1, bpe, seed=2)
    other.save_pretrained(tmp_path / "d")
    letters.save_pretrained(tmp_path / "d")
    with pytest.raises(IncompatiblePairError, match="vocabular"):
        load_model_pair(str(tmp_path / "t"), str(tmp_path / "d"))


def test_lm_head_rows_past_the_tokenizer_are_never_drawn(tmp_path, monkeypatch, tokenizer) -> None:
    """Embeddings padded past the tokenizer (Qwen3: 151,936 rows, 151,669 ids), with the
    padding rows made the likeliest by far: no greedy or sampled token is ever one of them."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    vocab = len(tokenizer)
    for name, size, seed in (("t", vocab + 64, 1), ("d", vocab + 8, 2)):
        model = random_qwen3(SMALL_SPEC, size, 1, tokenizer, seed=seed)
        attract_to_padding(model.lm_head.weight, vocab)
        model.save_pretrained(tmp_path / name)
        tokenizer.save_pretrained(tmp_path / name)
    pair = load_model_pair(str(tmp_path / "t"), str(tmp_path / "d"))
    assert pair.vocab_size == vocab
    assert pair.target.dtype == torch.float32 and pair.device == torch.device("cpu")
    assert pair.eos_token_ids == {tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")}
    assert pair.max_context == SMALL_SPEC.max_position_embeddings
    results = Engine(pair, lookahead=2).generate(
        [GenerationRequest("hello", max_new_tokens=6, temperature=t) for t in (0.0, 1.0)]
    )
    assert all(0 <= t < vocab for result in results for t in result.tokens)
    with pytest.raises(ValueError, match="dtype"):
        load_model_pair(str(tmp_path / "t"), dtype="int3")


def test_a_stall_between_steps_counts_in_what_a_token_costs_a_row(pair) -> None:
    """A row waits for its next token through whatever the loop does between steps
    (a scoring pass, its own bookkeeping), not only through the step: the pace b_SLA
    holds and admission prices rows at includes it; step seconds do not."""
    stall_s = 0.03
    engine = Engine(pair)
    snapshot = engine._take_snapshot

    def slow_snapshot():
        load = snapshot()
        time.sleep(stall_s)  # the injected stall between two steps
        return load

    engine._take_snapshot = slow_snapshot
    steps: list[int] = []
    engine.generate(
        [GenerationRequest("hello world", max_new_tokens=12)],
        mode="target_only",
        on_step=lambda updates: steps.append(len(updates)),
    )
    load = snapshot()
    assert len(steps) == 12, "one token a step without a draft"
    assert load.cycle_seconds_total >= load.step_seconds_total + stall_s * (len(steps) - 1)
    kept = (1 - STEP_SECONDS_SMOOTHING) ** (len(steps) - 1)  # of the first cycle, which has no stall
    assert load.seconds_per_token > load.step_seconds + 0.9 * stall_s * (1 - kept)


def test_rows_are_handed_over_the_step_they_finish(pair) -> None:
    rows = prompts(3, pair.vocab_size, seed=5)
    finished: list[tuple[int, int]] = []
    results = Engine(pair, lookahead=2).generate(
        [GenerationRequest(p, max_new_tokens=n) for p, n in zip(rows, [12, 3, 7], strict=True)],
        on_finished=lambda row, result: finished.append((row, result.num_output_tokens)),
    )
    assert [row for row, _ in finished] == [1, 2, 0], "shorter rows are handed over first"
    assert dict(finished) == {i: r.num_output_tokens for i, r in enumerate(results)}


def test_the_readme_engine_example_runs_as_written(tiny_pair_dir) -> None:
    readme = (tiny_pair_dir.parents[1] / "README.md").read_text()
    [example] = [b for b in re.findall(r"```python\n(.*?)```", readme, re.DOTALL) if "Engine(" in b]
    reply = subprocess.run(
        [sys.executable, "-c", example],
        cwd=tiny_pair_dir.parents[1],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert reply.returncode == 0, reply.stderr
    assert "{" in reply.stdout and "}" in reply.stdout, "prints the steps run per K"

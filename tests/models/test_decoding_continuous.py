"""The continuous engine: rows join and leave at step boundaries, KV memory in blocks,
preemption, chunked prefill, per-step K, cancellation and faults — exact throughout."""

from __future__ import annotations

import functools
import itertools
import random
import threading
import time
from collections.abc import Callable

import pytest
from pairs import prompts

from specbatch.decoding import Engine, GenerationRequest, GenerationResult, ModelPair
from specbatch.decoding.lookahead import BatchShape, StepOutcome, iteration_costs_name

NEW_TOKENS = 24


@pytest.fixture(scope="module")
def reference(pair: ModelPair) -> Callable[..., list[int]]:
    """``reference(prompt, new_tokens)``: the target's own greedy output for one prompt
    decoded alone, computed once per prompt and budget."""

    @functools.cache
    def decode(prompt: tuple[int, ...], new_tokens: int = NEW_TOKENS) -> list[int]:
        request = GenerationRequest(list(prompt), max_new_tokens=new_tokens)
        return Engine(pair).generate([request], mode="target_only")[0].tokens

    return decode


class _Collect:
    """A sink that records tokens per step and results, and signals completion."""

    def __init__(self, count: int, on_tokens=None) -> None:
        self.steps: list[dict[int, list[int]]] = []
        self.results: dict[int, GenerationResult] = {}
        self.count = count
        self.done = threading.Event()
        self._hook = on_tokens

    def on_tokens(self, updates: dict[int, list[int]]) -> None:
        self.steps.append(updates)
        if self._hook is not None:
            self._hook(self)

    def on_finished(self, key: int, result: GenerationResult) -> None:
        self.results[key] = result
        if len(self.results) == self.count:
            self.done.set()

    def wait(self) -> dict[int, GenerationResult]:
        assert self.done.wait(120), "the engine did not finish"
        return self.results


class _RandomK:
    """A lookahead policy that picks a different K (0..8) every step."""

    name = "random"

    def __init__(self, seed: int) -> None:
        self._random = random.Random(seed)
        self.k = 4
        self.feeds_drafts = True
        self.chosen: list[int] = []

    def choose(self, batch: BatchShape) -> int:
        self.k = self._random.randint(0, 8)
        self.feeds_drafts = self._random.random() < 0.5  # new rows' drafts fed while plain, or not
        self.chosen.append(self.k)
        return self.k

    def record(self, step: StepOutcome) -> None:
        pass


def test_rows_that_join_a_running_batch_are_exact(pair, reference) -> None:
    rows = prompts(6, pair.vocab_size, seed=21)
    engine = Engine(pair, lookahead=3)
    late = _Collect(3)
    joined = threading.Event()

    def join_after_three_steps(sink: _Collect) -> None:
        if len(sink.steps) == 3 and not joined.is_set():
            joined.set()
            engine.submit_many([GenerationRequest(p, max_new_tokens=NEW_TOKENS) for p in rows[3:]], late)

    early = _Collect(3, on_tokens=join_after_three_steps)
    engine.submit_many([GenerationRequest(p, max_new_tokens=NEW_TOKENS) for p in rows[:3]], early)
    early_results, late_results = early.wait(), late.wait()
    assert joined.is_set()
    for key, prompt in enumerate(rows[:3]):
        assert early_results[key].tokens == reference(tuple(prompt))
    for key, prompt in enumerate(rows[3:]):
        assert late_results[key].tokens == reference(tuple(prompt))
    # the late rows ran beside the early ones: some step carried tokens for both sinks
    assert len(early.steps) > 3 and len(late.steps) < len(early.steps) + NEW_TOKENS


def test_rows_beyond_max_rows_wait_and_join_as_others_leave(pair, reference) -> None:
    rows = prompts(7, pair.vocab_size, seed=22)
    budgets = [4, 30, 8, 12, 30, 5, 20]
    engine = Engine(pair, lookahead="goodput", max_rows=3)
    running: list[int] = []
    results = engine.generate(
        [GenerationRequest(p, max_new_tokens=n) for p, n in zip(rows, budgets, strict=True)],
        on_step=lambda _: running.append(len(engine._running)),
    )
    assert max(running) == 3
    for prompt, budget, result in zip(rows, budgets, results, strict=True):
        assert result.tokens == reference(tuple(prompt), budget)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_different_k_every_step_stays_exact(seed: int, pair, reference) -> None:
    rows = prompts(6, pair.vocab_size, seed=23)
    engine = Engine(pair)
    engine.lookahead = _RandomK(seed)
    results = engine.generate([GenerationRequest(p, max_new_tokens=NEW_TOKENS) for p in rows])
    assert {0, 8} <= set(engine.lookahead.chosen) or len(set(engine.lookahead.chosen)) > 4
    for prompt, result in zip(rows, results, strict=True):
        assert result.tokens == reference(tuple(prompt))


def test_preempted_rows_are_requeued_and_stay_exact(pair, reference) -> None:
    rows = prompts(6, pair.vocab_size, seed=24, min_len=8, max_len=14)
    block = 4
    # room for about three rows at full length: the others wait or are preempted
    budget = 3 * (14 + NEW_TOKENS + 8) * pair.kv_bytes_per_token
    engine = Engine(pair, lookahead=4, kv_memory_budget_bytes=budget, block_size=block)
    held: list[int] = []
    results = engine.generate(
        [GenerationRequest(p, max_new_tokens=NEW_TOKENS) for p in rows],
        on_step=lambda _: held.append(engine.pool.num_held),
    )
    assert engine.snapshot().preemptions > 0
    assert sum(r.preemptions for r in results) == engine.snapshot().preemptions
    assert max(held) <= engine.pool.num_blocks
    for prompt, result in zip(rows, results, strict=True):
        assert result.tokens == reference(tuple(prompt))
        assert result.num_output_tokens == NEW_TOKENS


def test_a_step_without_kv_room_for_its_lookahead_runs_plain_and_is_counted(pair, reference) -> None:
    rows = prompts(3, pair.vocab_size, seed=31, min_len=12, max_len=12)
    budgets = (NEW_TOKENS, NEW_TOKENS // 2, NEW_TOKENS // 2)
    block = 4
    # the pool holds every row at its full length and no more: as the short rows near
    # their ends, the long row's K would grow them past it, so those steps run plain
    budget = sum(12 + n for n in budgets) * pair.kv_bytes_per_token
    tight = Engine(pair, lookahead=8, kv_memory_budget_bytes=budget, block_size=block)
    roomy = Engine(pair, lookahead=8, block_size=block)
    for engine in (tight, roomy):
        requests = [GenerationRequest(p, max_new_tokens=n) for p, n in zip(rows, budgets, strict=True)]
        for prompt, n, result in zip(rows, budgets, engine.generate(requests), strict=True):
            assert result.tokens == reference(tuple(prompt))[:n]
    cut = tight.snapshot().lookahead_cut_steps
    assert cut > 0 and tight.lookahead_steps[0] >= cut and tight.snapshot().preemptions == 0
    assert roomy.snapshot().lookahead_cut_steps == 0


def test_a_long_prompt_is_prefilled_in_chunks_while_running_rows_keep_decoding(pair, reference) -> None:
    chunk = 32
    engine = Engine(pair, lookahead=2, prefill_chunk=chunk)
    fed: list[tuple[str, int]] = []
    engine.feed_observer = lambda name, keys, tokens, positions, real: fed.append((name, int(real.sum())))
    budgets: list[int] = []
    budget = engine._prefill_budget
    engine._prefill_budget = lambda: budgets.append(budget()) or budgets[-1]
    short = prompts(1, pair.vocab_size, seed=25)[0]
    long_prompt = prompts(1, pair.vocab_size, seed=26, min_len=200, max_len=200)[0]
    runner = _Collect(1)
    late = _Collect(1)
    submitted = threading.Event()

    def submit_long(sink: _Collect) -> None:
        if not submitted.is_set():
            submitted.set()
            engine.submit(GenerationRequest(long_prompt, max_new_tokens=4), late)

    runner._hook = submit_long
    engine.submit(GenerationRequest(short, max_new_tokens=60), runner)
    runner.wait()
    late.wait()
    assert late.results[0].tokens == reference(tuple(long_prompt), 4)
    assert runner.results[0].tokens == reference(tuple(short), 60)
    # prefill keeps pace with decoding: `chunk` prompt tokens per token the running row
    # committed in the step before (1 to K + 1 = 3)
    assert min(budgets) >= chunk and chunk < max(budgets) <= 3 * chunk
    assert max(count for name, count in fed) <= max(budgets)
    chunks = [count for name, count in fed if count > 3]  # a decode pass feeds at most K + 1
    assert len(chunks) >= -(-199 // (3 * chunk))
    # while the long prompt was being prefilled, the short row got tokens every step
    assert len(runner.steps) >= len(chunks)


def test_a_leaving_row_frees_its_blocks_without_moving_anyone(pair) -> None:
    engine = Engine(pair, lookahead=2, block_size=4)
    stores = engine.runner.stores
    pointers = {n: [t.data_ptr() for t in s.keys + s.values] for n, s in stores.items()}
    rows = prompts(3, pair.vocab_size, seed=27)
    tables: list[dict[int, list[int]]] = []

    def record(_: dict) -> None:
        tables.append({r.key: list(r.blocks) for r in engine._running})

    results = engine.generate(
        [GenerationRequest(p, max_new_tokens=n) for p, n in zip(rows, [3, 20, 40], strict=True)],
        on_step=record,
    )
    assert all(r.finish_reason == "length" for r in results)
    assert {n: [t.data_ptr() for t in s.keys + s.values] for n, s in stores.items()} == pointers
    # once a row has left, every remaining row's blocks start as they were: nothing moved
    for before, after in itertools.pairwise(tables):
        for key, blocks in after.items():
            if key in before:
                assert blocks[: len(before[key])] == before[key]
    assert engine.pool.num_free == engine.pool.num_blocks


def test_blocks_held_track_the_tokens_each_row_needs(pair) -> None:
    block = 8
    engine = Engine(pair, lookahead=4, block_size=block)
    checks = []

    def check(_: dict) -> None:
        for row in engine._running:
            # enough for every token plus this step's lookahead, and at most one spare block
            assert len(row.blocks) * block >= row.seq_len
            checks.append(len(row.blocks) <= -(-(row.seq_len + 8) // block) + 1)
        assert engine.pool.num_held == sum(len(r.blocks) for r in engine._running)

    rows = prompts(4, pair.vocab_size, seed=28)
    engine.generate([GenerationRequest(p, max_new_tokens=40) for p in rows], on_step=check)
    assert checks and all(checks)


def test_cancel_takes_effect_at_the_next_step_and_deadlines_expire(pair, reference) -> None:
    engine = Engine(pair, lookahead=2)
    rows = prompts(3, pair.vocab_size, seed=29)
    handles: list = []

    def cancel_row_one(sink: _Collect) -> None:
        if len(sink.steps) == 2:
            engine.cancel(handles[1])

    sink = _Collect(3, on_tokens=cancel_row_one)
    handles.extend(
        engine.submit_many(
            [
                GenerationRequest(rows[0], max_new_tokens=30),
                GenerationRequest(rows[1], max_new_tokens=30),
                GenerationRequest(rows[2], max_new_tokens=30, deadline=time.monotonic() - 1),
            ],
            sink,
        )
    )
    results = sink.wait()
    assert results[1].finish_reason == "cancelled"
    assert 0 < results[1].num_output_tokens < 30
    assert results[1].tokens == reference(tuple(rows[1]), 30)[: results[1].num_output_tokens]
    assert results[2].finish_reason == "deadline" and results[2].num_output_tokens == 0
    assert results[0].tokens == reference(tuple(rows[0]), 30)


def test_static_batching_admits_only_into_an_empty_engine(pair) -> None:
    rows = prompts(6, pair.vocab_size, seed=30)
    engine = Engine(pair, lookahead=2, max_rows=3, batching="static")
    steps: list[set[int]] = []
    engine.generate(
        [GenerationRequest(p, max_new_tokens=n) for p, n in zip(rows, [4, 20, 4, 4, 4, 4], strict=True)],
        on_step=lambda _: steps.append({r.key for r in engine._running}),
    )
    batches = 0
    for before, after in itertools.pairwise([set(), *steps]):
        if after - before:  # rows were admitted: only into an engine that had emptied
            batches += 1
            assert not (after & before), f"{sorted(after)} joined a running batch {sorted(before)}"
    assert batches == 2


def test_a_fault_in_a_step_fails_its_rows_and_the_engine_goes_on(monkeypatch, pair, reference) -> None:
    engine = Engine(pair, lookahead=0)
    original = engine.runner.plain_step
    calls = {"n": 0}

    def failing_once(rows, name):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("injected fault")
        return original(rows, name)

    monkeypatch.setattr(engine.runner, "plain_step", failing_once)
    rows = prompts(2, pair.vocab_size, seed=31)
    with pytest.raises(RuntimeError, match="injected fault"):
        engine.generate([GenerationRequest(p, max_new_tokens=5) for p in rows])
    assert engine.pool.num_free == engine.pool.num_blocks
    assert engine.generate([GenerationRequest(rows[0], max_new_tokens=5)])[0].tokens == reference(
        tuple(rows[0]), 5
    )


def test_the_loop_thread_ends_when_idle(pair) -> None:
    engine = Engine(pair, lookahead=2)
    engine.generate([GenerationRequest([5, 6, 7], max_new_tokens=3)])
    thread = engine._thread
    if thread is not None:
        thread.join(timeout=30)
    assert engine._thread is None


def test_a_row_whose_output_cannot_be_settled_still_gets_one_result(monkeypatch, pair) -> None:
    engine = Engine(pair, lookahead=2)
    original = engine._stop_rules.finish
    calls = {"n": 0}

    def failing_once(row, reason=None):
        calls["n"] += 1
        if calls["n"] == 1:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "injected")
        return original(row, reason)

    monkeypatch.setattr(engine._stop_rules, "finish", failing_once)
    sink = _Collect(2)
    engine.submit_many([GenerationRequest([5, 6, 7], max_new_tokens=3)] * 2, sink)
    results = sink.wait()
    assert sorted(r.finish_reason for r in results.values()) == ["error", "length"]
    assert any("settling" in r.error for r in results.values())
    assert engine.generate([GenerationRequest([5, 6, 7], max_new_tokens=3)])[0].finish_reason == "length"


class _SwitchOn:
    """A lookahead policy that decodes plainly for ``plain`` steps, then speculates with
    K = 4; it keeps every outcome it is told of beside the batch it chose for. With
    ``feeds``, rows admitted while it decodes plainly have their drafts fed."""

    name = "switch_on"

    def __init__(self, plain: int, feeds: bool = False) -> None:
        self.plain = plain
        self.feeds_drafts = feeds
        self.k = 0
        self.offered: list[BatchShape] = []
        self.outcomes: list[tuple[BatchShape, StepOutcome]] = []

    def choose(self, batch: BatchShape) -> int:
        self.k = 0 if len(self.outcomes) < self.plain else 4
        self.offered.append(batch)
        return self.k

    def record(self, step: StepOutcome) -> None:
        self.outcomes.append((self.offered[-1], step))


def _switch_on_after_plain_steps(pair, reference, prefill_chunk: int, feeds: bool = False) -> _SwitchOn:
    """Four rows decoded plainly for six steps, then with K = 4, checked exact against the
    target's greedy output; the policy, with what it was offered and told."""
    rows = prompts(4, pair.vocab_size, seed=5, min_len=12, max_len=16)
    engine = Engine(pair, prefill_chunk=prefill_chunk)
    policy = _SwitchOn(plain=6, feeds=feeds)
    engine.lookahead = policy
    results = engine.generate([GenerationRequest(p, max_new_tokens=NEW_TOKENS) for p in rows])
    for result, prompt in zip(results, rows, strict=True):
        assert result.tokens == reference(tuple(prompt))
    return policy


def test_a_speculative_step_reports_the_rows_beside_it_apart(pair, reference) -> None:
    # After plain steps every draft lags and is caught up a chunk at a time; meanwhile
    # the lagging rows run a plain pass beside the speculative one. The policy is shown
    # the lags when it chooses; the step reports its speculative rows as its batch and
    # the rows beside (one token each) apart, so K is judged on what ran at K; and the
    # output stays exact.
    policy = _switch_on_after_plain_steps(pair, reference, prefill_chunk=8)
    mixed = [(offered, o) for offered, o in policy.outcomes if o.lookahead == 4 and o.plain_beside]
    assert mixed, "no step ran speculative rows beside lagging ones"
    for offered, outcome in mixed:
        speculated = len(outcome.batch.alphas)
        assert speculated == sum(1 for lag in offered.lags if lag == 0)
        assert speculated + outcome.plain_beside == len(offered.lags)
        assert not any(outcome.batch.lags)
        assert outcome.drafted == 4 * speculated
        assert speculated + outcome.plain_beside <= outcome.committed <= 5 * speculated + outcome.plain_beside


def test_the_choice_that_switches_speculation_on_runs_its_step_at_once(pair, reference) -> None:
    # Every draft lags after plain steps. When the policy switches speculation on, the
    # lagging drafts are fed before the step (the chunk covers them here), so the step
    # it chose runs at its K over every row, not as a plain step beside lagging drafts
    # that would leave the next choice to price the same catch-up again.
    policy = _switch_on_after_plain_steps(pair, reference, prefill_chunk=128)
    offered, switched = policy.outcomes[6]
    assert len(offered.lags) == 4 and all(offered.lags), "every draft lagged when speculation was switched on"
    assert switched.lookahead == 4
    assert switched.plain_beside == 0
    assert len(switched.batch.alphas) == 4
    assert switched.drafted == 16


def test_drafts_are_fed_while_plain_only_when_the_policy_wants_them(pair, reference) -> None:
    # A policy decoding plainly because the lagging drafts' catch-up would not repay
    # itself can still want the drafts of rows admitted now fed their prompts, so that
    # speculation can start once the lagging rows have left. Those rows then lag only by
    # the tokens committed plainly; a plain policy that does not want them (K = 0) feeds
    # no draft at all. Output stays exact either way.
    fed_before = pair.draft.tokens_fed
    rows = prompts(4, pair.vocab_size, seed=5, min_len=12, max_len=16)
    results = Engine(pair, lookahead=0).generate([GenerationRequest(p, max_new_tokens=8) for p in rows])
    assert pair.draft.tokens_fed == fed_before, "no draft fed while nothing wants it"
    for prompt, result in zip(rows, results, strict=True):
        assert result.tokens == reference(tuple(prompt), 8)
    policy = _switch_on_after_plain_steps(pair, reference, prefill_chunk=128, feeds=True)
    first, _ = policy.outcomes[0]
    assert not any(first.lags), "the drafts were fed the prompts before the first plain step"
    offered, switched = policy.outcomes[6]
    # the prompts are 12-16 tokens: a draft not fed would lag by its prompt and more
    assert all(0 < lag <= 7 for lag in offered.lags), "a draft lags by the tokens committed plainly only"
    assert switched.lookahead == 4 and len(switched.batch.alphas) == 4


def test_the_choice_sees_what_each_rows_draft_was_fed_and_the_tokens_it_asks_for(pair, reference) -> None:
    # Feeding a newcomer's prompt to its draft is what speculating costs per row that
    # joins; the policy prices it from the batch (feeds over tokens asked for), so every
    # row's feed and request reach the choice, a row that joined while speculating
    # included. Its prefill is not in any step's seconds. Output stays exact.
    rows = prompts(4, pair.vocab_size, seed=9, min_len=12, max_len=16)
    engine = Engine(pair, prefill_chunk=64)
    policy = _SwitchOn(plain=6)
    engine.lookahead = policy
    late = _Collect(1)
    late_ids: list[int] = []
    asked = {3: 9}  # the late row asks for fewer tokens than the others

    def join_while_speculating(sink: _Collect) -> None:
        if len(sink.steps) == 10 and not late_ids:
            request = GenerationRequest(rows[3], max_new_tokens=asked[3])
            late_ids.extend(h.row_id for h in engine.submit_many([request], late))

    early = _Collect(3, on_tokens=join_while_speculating)
    requests = [GenerationRequest(p, max_new_tokens=NEW_TOKENS) for p in rows[:3]]
    early_ids = [h.row_id for h in engine.submit_many(requests, early)]
    early_results, late_results = early.wait(), late.wait()
    for key, prompt in enumerate(rows[:3]):
        assert early_results[key].tokens == reference(tuple(prompt))
    assert late_results[0].tokens == reference(tuple(rows[3]))[: asked[3]]
    prompt_of = dict(zip([*early_ids, *late_ids], rows, strict=True))
    asks = {row_id: NEW_TOKENS for row_id in early_ids} | {late_ids[0]: asked[3]}
    seen = set()
    for batch in policy.offered:
        assert len(batch.feeds) == len(batch.requested) == len(batch.rows)
        for row_id, fed, requested in zip(batch.rows, batch.feeds, batch.requested, strict=True):
            assert fed == len(prompt_of[row_id]), "a prompt no cache held is fed to the draft whole"
            assert requested == asks[row_id]
            seen.add(row_id)
    assert late_ids[0] in seen, "the row that joined while speculating was offered to the choice"
    assert any(step.lookahead == 4 for _, step in policy.outcomes)


def test_timed_windows_open_and_close_on_a_drained_device(pair, reference) -> None:
    # On a GPU, work is queued without waiting; a wall-clock window closes on the next
    # synchronisation. Without a drain, the target's prefill would land in the step's
    # seconds and a catch-up's own device time in the step after it, biasing the
    # realised cost of long Ks. Each catch-up and each decode step is timed between
    # two drains, so its window holds its own work and nothing queued before it.
    rows = prompts(4, pair.vocab_size, seed=11, min_len=12, max_len=16)
    engine = Engine(pair, prefill_chunk=8)
    engine.lookahead = _SwitchOn(plain=6)
    trace: list[str] = []
    runner = engine.runner

    def traced(name: str, call: Callable) -> Callable:
        def run(*args, **kwargs):
            label = f"{name} {args[1]}" if name in ("prefill", "plain_step") else name
            trace.append(label)
            return call(*args, **kwargs)

        return run

    runner.clock.drain = traced("drain", runner.clock.drain)
    for name in ("prefill", "speculative_step", "plain_step"):
        setattr(runner, name, traced(name, getattr(runner, name)))
    results = engine.generate([GenerationRequest(p, max_new_tokens=NEW_TOKENS) for p in rows])
    for result, prompt in zip(results, rows, strict=True):
        assert result.tokens == reference(tuple(prompt))
    catch_ups = [i for i, label in enumerate(trace) if label == "prefill draft"]
    steps = [i for i, label in enumerate(trace) if label in ("speculative_step", "plain_step target")]
    assert catch_ups and "speculative_step" in trace
    for i in catch_ups:
        assert trace[i - 1] == "drain" and trace[i + 1] == "drain", trace[i - 1 : i + 2]
    for i in steps:
        before = trace[i - 1] if trace[i - 1] != "speculative_step" else trace[i - 2]
        assert before == "drain", trace[i - 2 : i + 1]


def test_a_step_is_judged_against_the_batch_as_it_stood_before_it_ran(pair, reference) -> None:
    # A step's own outcome must not move the acceptance it is predicted from: a lucky
    # step raising its rows' estimates would make its prediction look missed. What the
    # policy is told of a step carries the rows as they were offered to its choice.
    policy = _switch_on_after_plain_steps(pair, reference, prefill_chunk=128)
    judged = [(offered, o) for offered, o in policy.outcomes if o.lookahead == 4 and not any(offered.lags)]
    assert len(judged) >= 3
    for offered, outcome in judged:
        assert (outcome.batch.alphas, outcome.batch.span) == (offered.alphas, offered.span)


class _Recorded:
    """Fixed K = 2 that keeps every outcome it is told of."""

    name = "recorded"

    def __init__(self) -> None:
        self.k = 2
        self.feeds_drafts = True
        self.outcomes: list[StepOutcome] = []

    def choose(self, batch: BatchShape) -> int:
        return self.k

    def record(self, step: StepOutcome) -> None:
        self.outcomes.append(step)


def test_the_iteration_around_a_step_is_part_of_what_the_step_cost(pair, reference) -> None:
    # Delivering a step's tokens (here a sink that takes 5 ms over them) is paid once a
    # step whatever it commits, outside the passes: the policy is told the step's
    # seconds with it, and the engine's iteration cost model learns it, so the choice of
    # K prices it for every K. Output stays exact.
    delivery = 0.005
    rows = prompts(2, pair.vocab_size, seed=13, min_len=12, max_len=16)
    engine = Engine(pair)
    policy = _Recorded()
    engine.lookahead = policy
    sink = _Collect(2, on_tokens=lambda _: time.sleep(delivery))
    engine.submit_many([GenerationRequest(p, max_new_tokens=NEW_TOKENS) for p in rows], sink)
    for key, prompt in enumerate(rows):
        assert sink.wait()[key].tokens == reference(tuple(prompt))
    assert policy.outcomes and all(o.seconds >= delivery for o in policy.outcomes)
    iterations = [engine.runner.costs[iteration_costs_name(k)] for k in (0, 1)]
    assert sum(model.observations for model in iterations) == len(policy.outcomes)
    assert all(model.predict(2, 0, 0) >= 0.9 * delivery for model in iterations if model.observations)

"""Greedy speculative decoding must reproduce the target's own greedy output exactly,
and no model may ever be fed a token it has already cached."""

from __future__ import annotations

import collections
import functools

import pytest
import torch
from pairs import make_pair, prompts

from specbatch.decoding import Engine, GenerationRequest
from specbatch.decoding.steps import MAX_DRAFT_CATCH_UP

NEW_TOKENS = 20
PAIRS = {
    "same": ("same", 0.0),
    "unrelated": ("unrelated", 0.0),
    "controlled_eps0.05": ("controlled", 0.05),
    "controlled_eps0.3": ("controlled", 0.3),
    "controlled_eps1": ("controlled", 1.0),
}


@functools.cache
def _pair(name: str):
    kind, epsilon = PAIRS[name]
    return make_pair(kind, epsilon=epsilon)


@functools.cache
def _reference(name: str) -> tuple[tuple[int, ...], ...]:
    """Each prompt decoded alone with target_only greedy."""
    pair = _pair(name)
    engine = Engine(pair)
    rows = prompts(8, pair.vocab_size, seed=5)
    return tuple(
        tuple(
            engine.generate([GenerationRequest(p, max_new_tokens=NEW_TOKENS)], mode="target_only")[0].tokens
        )
        for p in rows
    )


def _greedy(rows: list[list[int]], new_tokens: int = NEW_TOKENS) -> list[GenerationRequest]:
    return [GenerationRequest(p, max_new_tokens=new_tokens) for p in rows]


# Compiled runs cover the padded shapes (batches 1, 3 and 8 pad to buckets 1, 4 and 8)
# and the smallest, a middle and the largest K; each new shape costs a compilation.
GREEDY_CASES = [(name, k, "none", range(1, 9)) for name in PAIRS for k in range(1, 9)] + [
    pytest.param("controlled_eps0.3", k, "default", (1, 3, 8), marks=pytest.mark.slow) for k in (1, 3, 8)
]


@pytest.mark.parametrize(("name", "lookahead", "compile", "batches"), GREEDY_CASES)
def test_greedy_speculative_equals_target_only_for_every_batch_size(
    name: str, lookahead: int, compile: str, batches: range
) -> None:
    pair = _pair(name)
    engine = Engine(pair, lookahead=lookahead, compile=compile)
    rows = prompts(8, pair.vocab_size, seed=5)
    reference = _reference(name)
    for batch in batches:
        results = engine.generate(_greedy(rows[:batch]), mode="speculative")
        for row, result in enumerate(results):
            assert tuple(result.tokens) == reference[row], f"batch {batch}, row {row}"
            assert result.num_output_tokens == NEW_TOKENS
            assert result.finish_reason == "length"


@pytest.mark.parametrize(
    ("name", "compile"),
    [(name, "none") for name in PAIRS] + [pytest.param("unrelated", "default", marks=pytest.mark.slow)],
)
def test_batched_target_only_equals_each_row_alone(name: str, compile: str) -> None:
    pair = _pair(name)
    rows = prompts(8, pair.vocab_size, seed=5)
    results = Engine(pair, compile=compile).generate(_greedy(rows), mode="target_only")
    assert [tuple(r.tokens) for r in results] == list(_reference(name))


def test_acceptance_reflects_the_draft() -> None:
    rows = prompts(8, 600, seed=5)
    same = Engine(_pair("same"), lookahead=4).generate(_greedy(rows), mode="speculative")
    unrelated = Engine(_pair("unrelated"), lookahead=4).generate(_greedy(rows), mode="speculative")
    assert all(r.acceptance_rate == 1.0 for r in same)
    assert sum(r.total_accepted_draft_tokens for r in unrelated) < 0.2 * sum(
        r.total_draft_tokens for r in unrelated
    )


@pytest.mark.parametrize(("policy", "lowest"), [("adaptive_rule", 1), ("goodput", 0)])
def test_adaptive_lookahead_stays_exact(policy: str, lowest: int) -> None:
    name = "controlled_eps0.3"
    pair = _pair(name)
    engine = Engine(pair, lookahead=policy)
    rows = prompts(8, pair.vocab_size, seed=5)
    ks = []
    for _ in range(3):
        results = engine.generate(_greedy(rows), mode="speculative")
        ks.append(engine.lookahead.k)
        assert [tuple(r.tokens) for r in results] == list(_reference(name))
    assert all(lowest <= k <= 8 for k in ks)


def test_greedy_rows_stay_exact_beside_sampled_rows() -> None:
    name = "controlled_eps0.3"
    pair = _pair(name)
    rows = prompts(8, pair.vocab_size, seed=5)
    requests = [
        GenerationRequest(
            p, max_new_tokens=NEW_TOKENS, temperature=0.0 if i % 2 == 0 else 0.9, top_k=i, seed=i
        )
        for i, p in enumerate(rows)
    ]
    results = Engine(pair, lookahead=3).generate(requests, mode="speculative")
    for i, result in enumerate(results):
        if i % 2 == 0:
            assert tuple(result.tokens) == _reference(name)[i]


class _FeedLog:
    """Records every real (non-padding) token each model is fed, per request row."""

    def __init__(self) -> None:
        self.fed: dict[str, list[tuple[int, int, int]]] = collections.defaultdict(list)
        self.batch_sizes: list[int] = []

    def __call__(
        self, model: str, rows: list[int], tokens: torch.Tensor, positions: torch.Tensor, real: torch.Tensor
    ):
        if model == "target":
            self.batch_sizes.append(len(rows))
        for b, request in enumerate(rows):
            for t in range(tokens.shape[1]):
                if bool(real[b, t]):
                    self.fed[model].append((request, int(positions[b, t]), int(tokens[b, t])))


@pytest.mark.parametrize("name", ["same", "controlled_eps0.3", "unrelated"])
@pytest.mark.parametrize("lookahead", [1, 3, 8])
def test_no_model_is_fed_a_token_it_has_cached(name: str, lookahead: int) -> None:
    pair = _pair(name)
    rows = prompts(5, pair.vocab_size, seed=9)
    engine = Engine(pair, lookahead=lookahead)
    log = _FeedLog()
    engine.feed_observer = log
    target_before, draft_before = pair.target.tokens_fed, pair.draft.tokens_fed
    results = engine.generate(_greedy(rows, 17), mode="speculative")
    assert len(log.fed["target"]) == pair.target.tokens_fed - target_before
    assert len(log.fed["draft"]) == pair.draft.tokens_fed - draft_before
    for model in ("target", "draft"):
        last_fed: dict[tuple[int, int], int] = {}
        for request, position, token in log.fed[model]:
            last_fed[request, position] = token
        for request, (prompt, result) in enumerate(zip(rows, results, strict=True)):
            committed = prompt + result.tokens
            # what finally sits in each cache slot is the committed token (a valid cache):
            # the target holds all but the last token; the draft may lag a few more (its
            # last proposal is never fed, and a row's last token may come from a plain step)
            fed = sorted(p for r, p in last_fed if r == request)
            held = len(committed) - 1 if model == "target" else len(committed) - 1 - MAX_DRAFT_CATCH_UP
            assert fed[:held] == list(range(held)), model
            cached = [last_fed[request, p] for p in range(held)]
            assert cached == committed[:held], model
    # The target sees each committed token once and each rejected draft once; the only
    # extra tokens are drafts accepted past a row's budget in its last step.
    rejected = sum(r.total_draft_tokens - r.total_accepted_draft_tokens for r in results)
    committed_fed = sum(len(p) + r.num_output_tokens - 1 for p, r in zip(rows, results, strict=True))
    overshoot = len(log.fed["target"]) - committed_fed - rejected
    assert 0 <= overshoot <= len(rows) * lookahead


@pytest.mark.parametrize("lookahead", [1, 2, 5, 8])
def test_fed_token_count_is_exact_at_full_acceptance(lookahead: int) -> None:
    pair = _pair("same")
    rows = prompts(4, pair.vocab_size, seed=4)
    budget = 3 * (lookahead + 1)
    log = _FeedLog()
    engine = Engine(pair, lookahead=lookahead)
    engine.feed_observer = log
    results = engine.generate(_greedy(rows, budget), mode="speculative")
    assert all(r.acceptance_rate == 1.0 for r in results)
    # target: everything but the pending last token; draft: also not the last draft token
    assert len(log.fed["target"]) == sum(len(p) + budget - 1 for p in rows)
    assert len(log.fed["draft"]) == sum(len(p) + budget - 2 for p in rows)


def test_target_only_feeds_each_token_once_and_finished_rows_leave() -> None:
    pair = _pair("same")
    rows = prompts(4, pair.vocab_size, seed=2)
    budgets = [3, 6, 9, 12]
    log = _FeedLog()
    engine = Engine(pair)
    engine.feed_observer = log
    results = engine.generate(
        [GenerationRequest(p, max_new_tokens=n) for p, n in zip(rows, budgets, strict=True)],
        mode="target_only",
    )
    assert [r.num_output_tokens for r in results] == budgets
    assert len(log.fed["target"]) == sum(len(p) + n - 1 for p, n in zip(rows, budgets, strict=True))
    assert len(set(log.fed["target"])) == len(log.fed["target"])
    # a prefill pass (which samples nothing), then one token per row per step
    assert log.batch_sizes == [4] + [4] * 3 + [3] * 3 + [2] * 3 + [1] * 3


def test_speculative_rows_leave_the_batch_when_done() -> None:
    pair = _pair("same")
    rows = prompts(3, pair.vocab_size, seed=2)
    log = _FeedLog()
    engine = Engine(pair, lookahead=2)
    engine.feed_observer = log
    results = engine.generate(
        [GenerationRequest(p, max_new_tokens=n) for p, n in zip(rows, [3, 9, 15], strict=True)],
        mode="speculative",
    )
    assert [r.num_output_tokens for r in results] == [3, 9, 15]
    # prefill, then three tokens per step at acceptance 1: rows finish after 1, 3 and 5 steps
    assert log.batch_sizes == [3, 3, 2, 2, 1, 1]

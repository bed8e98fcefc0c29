"""bench_lookahead's --log-choices: every step goodput records, with its own prediction
of that step (the plain pass beside it included) and when it was recorded, lands in the
round it ran in, and still reaches the policy."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from bench_lookahead import ChoiceLog

from specbatch.decoding.costs import PassCosts
from specbatch.decoding.lookahead import BatchShape, GoodputLookahead, StepOutcome


def _costs(per_token: float, fixed: float) -> PassCosts:
    costs = PassCosts()
    for tokens in (1, 4, 16, 64):
        for span in (10, 100):
            costs.observe(tokens, 4 * span, tokens * span, fixed + per_token * tokens)
    return costs


def _passes_alone(passes: PassCosts) -> dict[str, PassCosts]:
    """Costs in which both networks' passes cost ``passes`` and nothing else costs."""
    overheads = ("step_speculative", "step_plain", "iteration_speculative", "iteration_plain")
    free = {name: _costs(0, 0) for name in overheads}
    return {"target": passes, "draft": passes, **free}


def test_each_recorded_step_is_logged_in_its_round_with_the_policys_prediction():
    passes = _costs(1e-4, 0.01)
    policy = GoodputLookahead(_passes_alone(passes))
    ticks = iter([100.0, 100.5, 101.25])
    log = ChoiceLog(clock=lambda: next(ticks))
    log.attach(policy)
    batch = BatchShape(alphas=[0.8, 0.6], remaining=[50, 50], span=40)
    policy.record(StepOutcome(3, batch, 6, 4, 6, 0.05))  # before any round: not logged
    log.start("a70", 2, -1)
    policy.record(StepOutcome(0, batch, 0, 0, 2, 0.02))
    log.start("a70", 2, 0)
    lagging = BatchShape(alphas=[0.7], remaining=[50], span=40, lags=[40])
    policy.record(StepOutcome(2, batch, 4, 3, 5, 0.04, beside=lagging))

    assert [(r["pair"], r["concurrency"], r["round"]) for r in log.rounds] == [("a70", 2, -1), ("a70", 2, 0)]
    [plain] = log.rounds[0]["steps"]
    assert plain == {
        "k": 0,
        "rows": 2,
        "beside": 0,
        "predicted": list(policy.predict(batch, 0)),
        "realised": [2, 0.02],
        "at": 0.5,
    }
    [speculative] = log.rounds[1]["steps"]
    assert (speculative["k"], speculative["beside"], speculative["realised"], speculative["at"]) == (
        2,
        1,
        [5, 0.04],
        1.25,
    )
    step_prediction = policy.predict(batch, 2)
    beside_prediction = policy.predict(lagging, 0)
    assert speculative["predicted"] == [step_prediction[0] + 1, step_prediction[1] + beside_prediction[1]]
    # the policy learnt from all three steps: its corrections moved off the prior
    assert policy.realised.corrections(2, [0, 2]) != [(1.0, 1.0), (1.0, 1.0)]


def test_each_choice_is_logged_with_every_ks_corrected_prediction():
    passes = _costs(1e-4, 0.01)
    policy = GoodputLookahead(_passes_alone(passes))
    ticks = iter([10.0, 12.0])
    log = ChoiceLog(clock=lambda: next(ticks))
    log.attach(policy)
    lagging = BatchShape(
        alphas=[0.9, 0.9], remaining=[40, 60], span=50, lags=[30, 0], feeds=[50, 20], requested=[64, 64]
    )
    log.start("a90", 32, 1)
    k = policy.choose(lagging)
    [choice] = log.rounds[0]["choices"]
    assert choice == {
        "k": k,
        "rows": 2,
        "alphas": [0.9, 0.9],
        "remaining": [40, 60],
        "lagging": 1,
        "lag_tokens": 30,
        "catch_up_s": policy.catch_up_seconds(lagging),
        "feed_s_per_token": policy.feeds.seconds_per_token,
        "corrected": [list(step) for step in policy.corrected(lagging, range(9))],
        "at": 2.0,
    }
    assert choice["catch_up_s"] > 0 and choice["feed_s_per_token"] > 0 and len(choice["corrected"]) == 9
    assert policy.k == k, "the logged choice is the policy's own"

"""Simulator: workload generators, service model, event loop invariants, determinism, Theorem 4.2."""

from __future__ import annotations

import json

import numpy as np
import pytest

from specbatch.scheduling.simulate.__main__ import main
from specbatch.scheduling.static import PolicyConfig, SimulationConfigError
from specbatch.scheduling.static.simulate.cluster import ClusterConfig, ServiceTimeModel
from specbatch.scheduling.static.simulate.engine import Simulator
from specbatch.scheduling.static.simulate.experiments.scenarios import ServingScenario
from specbatch.scheduling.static.simulate.experiments.theorem42 import theorem42_rows
from specbatch.scheduling.static.simulate.theory import theoretical_multibin_throughput
from specbatch.scheduling.static.simulate.workload import (
    BinConfusionPredictor,
    EmpiricalLengths,
    GammaLengths,
    NoisyPredictor,
    OnOffArrivals,
    OraclePredictor,
    PoissonArrivals,
    SimulatedWorkload,
    StepArrivals,
    UniformLengths,
)


def test_theorem42_closed_form_matches_the_papers_gains() -> None:
    base = theoretical_multibin_throughput(128, 1, 1, 20)
    gains = [theoretical_multibin_throughput(128, k, 1, 20) / base for k in (2, 4, 8, 16)]
    assert [round(g, 2) for g in gains] == [1.31, 1.55, 1.70, 1.79]


def test_simulated_multibin_throughput_is_within_3_percent_of_theorem42() -> None:
    rows = theorem42_rows(horizon=3_000.0, seed=0)
    assert [r["k"] for r in rows] == [1, 2, 4, 8, 16]
    for row in rows:
        assert abs(row["simulated_throughput"] / row["theoretical_throughput"] - 1) < 0.03, row


def test_cli_writes_theorem42_json_and_plot(tmp_path) -> None:
    assert main(["theorem42", "--quick", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "theorem42.json").read_text())
    assert [r["k"] for r in rows] == [1, 2, 4, 8, 16]
    assert all({"k", "simulated_throughput", "theoretical_throughput"} <= set(r) for r in rows)
    assert (tmp_path / "sched_theorem42.png").stat().st_size > 0


def test_batch_time_is_a0_plus_a1_max_len_h_b() -> None:
    workload = SimulatedWorkload(
        arrival_s=np.zeros(3),
        input_tokens=np.array([1, 2, 3]),
        output_tokens=np.array([5.0, 10.0, 7.0]),
        predicted_tokens=np.array([5.0, 10.0, 7.0]),
        deadline_s=None,
    )
    service = ServiceTimeModel(a0=0.5, a1=0.1, slope=0.25)
    config = PolicyConfig(num_bins=1, fixed_batch_size=3, dynamic=False, flush_window_s=None, max_len=20)
    result = Simulator(config, ClusterConfig(num_servers=1, service=service)).run(workload, horizon_s=100.0)
    (batch,) = result.batches
    step = 0.1 * (1 + 0.25 * 2)
    assert batch.step_seconds == pytest.approx(step)
    assert batch.end_s == pytest.approx(0.5 + step * 10)
    np.testing.assert_allclose(result.outcome.finish_s, 0.5 + step * np.array([5.0, 10.0, 7.0]))
    assert batch.kv_demand_tokens == 28


def test_kv_overflow_costs_extra_passes() -> None:
    workload = SimulatedWorkload(
        arrival_s=np.zeros(2),
        input_tokens=np.array([50, 50]),
        output_tokens=np.array([10.0, 10.0]),
        predicted_tokens=np.array([10.0, 10.0]),
        deadline_s=None,
    )
    config = PolicyConfig(num_bins=1, fixed_batch_size=2, dynamic=False, flush_window_s=None, max_len=20)
    cluster = ClusterConfig(
        num_servers=1, service=ServiceTimeModel(a0=0, a1=1, slope=0), kv_capacity_tokens=100
    )
    result = Simulator(config, cluster).run(workload, horizon_s=100.0)
    assert result.batches[0].passes == 2
    assert result.batches[0].end_s == pytest.approx(20.0)
    assert result.metrics.kv_overflow_batches == 1


def _serving_run(seed: int):
    scenario = ServingScenario()
    workload = scenario.workload(PoissonArrivals(2.0), 900.0, seed)
    return workload, Simulator(scenario.dynamic_policy(num_bins=4), scenario.cluster).run(
        workload, 900.0, warmup_s=90.0, drain_s=120.0
    )


def test_simulation_is_deterministic_for_a_fixed_seed() -> None:
    _, first = _serving_run(seed=7)
    _, again = _serving_run(seed=7)
    _, other = _serving_run(seed=8)
    assert first.metrics.to_dict() == again.metrics.to_dict()
    assert first.batches == again.batches
    assert first.metrics.to_dict() != other.metrics.to_dict()


def test_dynamic_policy_keeps_kv_within_capacity_and_accounts_for_every_request() -> None:
    workload, result = _serving_run(seed=3)
    metrics = result.metrics
    assert metrics.peak_kv_demand_tokens <= ServingScenario().kv_capacity_tokens
    assert metrics.kv_overflow_batches == 0
    outcome = result.outcome
    served = ~np.isnan(outcome.start_s)
    assert not np.any(served & outcome.expired)
    assert np.all(outcome.start_s[served] >= workload.arrival_s[served])
    assert sum(b.size for b in result.batches) == int(served.sum())
    assert 0 < metrics.utilisation <= 1
    assert sum(metrics.batch_size_histogram.values()) <= len(result.batches)
    assert sum(row.requests for row in metrics.per_bin) == int(
        (served & (workload.arrival_s >= 90.0) & (workload.arrival_s < 900.0)).sum()
    )


def test_poisson_and_step_arrivals_have_the_requested_rates() -> None:
    rng = np.random.default_rng(0)
    times = PoissonArrivals(5.0).times(rng, 2_000.0)
    assert len(times) == pytest.approx(10_000, rel=0.05)
    assert np.all(np.diff(times) >= 0)
    step = StepArrivals(((0.0, 1.0), (1_000.0, 4.0))).times(rng, 2_000.0)
    assert (step < 1_000).sum() == pytest.approx(1_000, rel=0.1)
    assert (step >= 1_000).sum() == pytest.approx(4_000, rel=0.1)


def test_on_off_arrivals_come_in_bursts_at_the_mean_rate() -> None:
    process = OnOffArrivals(rate_on=10.0, rate_off=0.0, mean_on_s=5.0, mean_off_s=15.0)
    times = process.times(np.random.default_rng(1), 20_000.0)
    assert len(times) / 20_000.0 == pytest.approx(process.mean_rate_per_s, rel=0.1)
    gaps = np.diff(times)
    assert gaps.std() / gaps.mean() > 1.5, "ON/OFF traffic is burstier than Poisson (cv = 1)"


def test_length_distributions_respect_their_support() -> None:
    rng = np.random.default_rng(2)
    uniform = UniformLengths(1, 20).sample(rng, 1000)
    assert uniform.min() >= 1 and uniform.max() <= 20
    gamma = GammaLengths(mean=200, shape=2, low=1, high=500).sample(rng, 5000)
    assert gamma.min() >= 1 and gamma.max() <= 500 and np.all(gamma == np.round(gamma))
    empirical = EmpiricalLengths((3, 30, 300)).sample(rng, 100)
    assert set(empirical.tolist()) <= {3.0, 30.0, 300.0}
    with pytest.raises(SimulationConfigError):
        EmpiricalLengths(())


def test_predictors() -> None:
    rng = np.random.default_rng(3)
    true = UniformLengths(1, 20).sample(rng, 2000)
    np.testing.assert_array_equal(OraclePredictor().predict(rng, true), true)
    noisy = NoisyPredictor(0.3).predict(rng, true)
    assert np.std(np.log(noisy / true)) == pytest.approx(0.3, rel=0.1)
    perfect = BinConfusionPredictor.adjacent(4, accuracy=1.0, low=1, high=20).predict(rng, true)
    cuts = [5.75, 10.5, 15.25]
    np.testing.assert_array_equal(
        np.searchsorted(cuts, perfect, "right"), np.searchsorted(cuts, true, "right")
    )
    confused = BinConfusionPredictor.adjacent(4, accuracy=0.5, low=1, high=20).predict(rng, true)
    moved = np.searchsorted(cuts, confused, "right") - np.searchsorted(cuts, true, "right")
    assert set(np.unique(moved).tolist()) == {-1, 0, 1}
    assert np.mean(moved == 0) == pytest.approx(0.5, abs=0.05)



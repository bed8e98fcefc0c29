"""Figures for the experiments.

Built on ``matplotlib.figure.Figure`` directly, not pyplot, so plotting needs no display and
leaves no global figure state behind.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from matplotlib.figure import Figure

from specbatch.figures import save_figure
from specbatch.scheduling.static.simulate.records import BatchRecord


def plot_theorem42(rows: Sequence[Mapping], c_max: float, path: Path) -> Path:
    ks = [r["k"] for r in rows]
    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    ax.plot(ks, [r["theoretical_throughput"] for r in rows], "o-", label="Theorem 4.2")
    ax.plot(ks, [r["simulated_throughput"] for r in rows], "s--", label="simulated")
    ax.axhline(c_max, color="grey", linestyle=":", label=f"c_max = B/m = {c_max:.2f}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.set_xlabel("number of bins k")
    ax.set_ylabel("throughput (requests / time unit)")
    ax.set_title("Multi-bin batching: B = 128, U(1, 20), one saturated server", fontsize=10)
    ax.legend()
    ax.grid(alpha=0.3)
    return save_figure(fig, path, dpi=120)


def plot_figure6(curves: Mapping[str, Mapping[int, Sequence[tuple[float, float]]]], path: Path) -> Path:
    """One panel per predictor: mean latency against throughput, one curve per k."""
    fig = Figure(figsize=(5 * len(curves), 4))
    axes = fig.subplots(1, len(curves), sharey=True, squeeze=False)
    for ax, (predictor, by_k) in zip(axes[0], curves.items(), strict=True):
        for k, points in by_k.items():
            ax.plot([p[0] for p in points], [p[1] for p in points], "o-", label=f"k = {k}")
        ax.set_title(f"predictor: {predictor}")
        ax.set_xlabel("throughput (requests / time unit)")
        ax.grid(alpha=0.3)
        ax.legend()
    axes[0][0].set_ylabel("mean latency (time units)")
    axes[0][0].set_yscale("log")
    fig.suptitle("B = 8, 8 servers, Poisson arrivals swept to saturation")
    return save_figure(fig, path, dpi=120)


def plot_batch_size_trace(
    batches: Sequence[BatchRecord], step_s: float, static_sizes: Mapping[str, float], path: Path
) -> Path:
    """Batch size per dispatch over time with the b_mem and b_SLA bounds in force, around a load step."""
    fig = Figure(figsize=(8, 4))
    ax = fig.subplots()
    times = [b.start_s for b in batches]
    ax.scatter(times, [b.size for b in batches], s=6, alpha=0.5, label="batch size (dynamic)")
    ax.step(times, [b.b_sla for b in batches], where="post", label="b_SLA", linewidth=1)
    ax.step(times, [b.b_mem for b in batches], where="post", label="b_mem", linewidth=1)
    window = 15
    sizes = [b.size for b in batches]
    rolling = [
        sum(sizes[max(0, i - window + 1) : i + 1]) / len(sizes[max(0, i - window + 1) : i + 1])
        for i in range(len(sizes))
    ]
    ax.plot(times, rolling, color="black", label=f"batch size, mean of last {window}")
    for label, size in static_sizes.items():
        ax.axhline(size, linestyle=":", color="grey")
        ax.annotate(label, (times[0] if times else 0, size), fontsize=7, va="bottom")
    ax.axvline(step_s, color="red", linestyle="--", label="load step")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("requests per batch")
    ax.set_title("Dynamic batch size after a load step")
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(alpha=0.3)
    return save_figure(fig, path, dpi=120)


def plot_policy_comparison(rows: Sequence[Mapping], path: Path) -> Path:
    """Throughput, p95 latency and SLA violations against offered load, one line per policy."""
    fig = Figure(figsize=(15, 4))
    axes = fig.subplots(1, 3)
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    for policy in policies:
        mine = [r for r in rows if r["policy"] == policy]
        load = [r["offered_rps"] for r in mine]
        axes[0].plot(load, [r["throughput_rps"] for r in mine], "o-", label=policy)
        axes[1].plot(load, [r["latency_p95_s"] for r in mine], "o-", label=policy)
        axes[2].plot(load, [100 * r["sla_violation_rate"] for r in mine], "o-", label=policy)
    for ax, label in zip(axes, ("throughput (req/s)", "p95 latency (s)", "SLA violations (%)"), strict=True):
        ax.set_xlabel("offered load (req/s)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle("Same workload and seeds, 2 workers")
    return save_figure(fig, path, dpi=120)


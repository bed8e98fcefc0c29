"""b_SLA on a machine slower than its SLA: the step simulator at several machine speeds.

Algorithm 2 (b_SLA) shrinks an instance's batch until its measured seconds per token
meet the SLA's per-token allowance. On a machine where even one row alone runs slower
than that allowance, the search ends at one row per instance and throughput collapses
without saving a row; `b_sla_pace: allowance_in_reach` and the default,
`slack_above_allowance`, hold each instance there to what its running rows can afford
of their finish budgets instead (the
"fixed allowance" set-up, `b_sla_pace: allowance`, does not). This script shows
the regime where that matters, and what `keep_promises` (refusing a request that would
push a queued prompt past the SLA it can still make) buys at each speed, on the step
simulator of bench_predict: the same arrivals,
prompts and `AdmissionPolicy` as the served set-ups (the scheduler's cpu config and each
set-up's SPECBATCH_* overrides, built by the server's own `build_admission`), each prompt
ending where the served target ends it, on two simulated instances, at the step costs
bench_predict read from the live instances (its JSON: the fit, and the tokens a row
committed per step at each batch size over the run) and at those costs times each
`--speeds` factor (below 1, a faster machine). Offered
rates (`--infobench-rates`, `--heavy-rates`, `--memory-rates`) are divided by the factor,
so every speed sees the same relative load; each point is the mean over `--seeds` arrival
seeds. `--setups` compares any of bench_policies' continuous set-ups instead (an
admission option against the default and the peers, on identical arrivals and steps:
no machine noise, so a gain of a few per cent that one live cell cannot resolve shows);
`memory` runs at that workload's KV budget, the rest with memory to spare.

    .venv/bin/python scripts/bench_slow_machine.py --predict results/bench_predict.json \
        --policies results/bench_policies.json
    .venv/bin/python scripts/bench_slow_machine.py --speeds 1 --workloads infobench heavy memory \
        --setups least_slack allowance_in_reach fcfs
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_policies import SETUPS, server_env, workloads  # noqa: E402
from bench_predict import (  # noqa: E402
    REPOSITORY,
    Phase,
    Requests,
    at_speed,
    bench_args,
    config_parameters,
    simulate,
)

from specbatch.figures import save_figure  # noqa: E402
from specbatch.scheduling.simulate.continuous import SimInstance, StepCosts  # noqa: E402
from specbatch.serving.scheduler.setup import build_admission  # noqa: E402
from specbatch.serving.settings import ModelSettings  # noqa: E402

logger = logging.getLogger("bench_slow_machine")

COMPARED = ("least_slack", "fixed_pace", "break_promises", "fcfs")
ROOMY_KV_TOKENS = 200_000  # memory never binds here: the comparison is of b_SLA and refusals
WORKLOADS = ("infobench", "heavy", "memory")
KV_BUDGET_KEY = "SPECBATCH_KV_MEMORY_BUDGET_GB"


def live_step_costs(predicted: dict) -> StepCosts:
    """bench_predict's fit of the live instances' step costs, each batch size at the
    tokens per row-step the run's rows committed there."""
    if not predicted.get("step_shape"):
        raise SystemExit(
            "the bench_predict JSON has no per-batch step figures (step_shape): "
            "run bench_predict on a bench_policies run of this code"
        )
    live = predicted["live_costs"]
    return StepCosts(
        base_s=live["base_s"],
        per_row_s=live["per_row_s"],
        per_prefill_token_s=live["per_prefill_token_s"],
        per_token_s=live["per_token_s"],
        per_context_slot_s=live.get("per_context_slot_s", 0.0),  # bench_predict JSON before it: none
        tokens_per_row_step=tuple(
            (b["mean_rows"], b["tokens_per_row_step"]) for b in predicted["step_shape"]
        ),
    )


def run(args: argparse.Namespace) -> list[dict]:
    """Goodput, refusals and admitted e2e p99 over SLA of every set-up, workload, speed
    and rate, each the mean over the seeds."""
    predicted = json.loads(args.predict.read_text())
    costs = live_step_costs(predicted)
    bench = bench_args(json.loads(args.policies.read_text())["config"])
    builders = {w.name: w for w in workloads(bench)}
    setups = {s.name: s for s in SETUPS}
    scheduler = config_parameters(REPOSITORY / "scheduler" / "configs" / "cpu.pbtxt")
    requests = Requests()
    requests.learn_ends(
        [
            arrival
            for workload in args.workloads
            for speed in args.speeds
            for base_rate in args.rates[workload]
            for seed in range(bench.seed, bench.seed + args.seeds)
            for arrival in builders[workload].build(base_rate / speed, args.duration, seed)
        ]
    )
    rows = []
    for workload in args.workloads:
        budget_gb = builders[workload].env.get(KV_BUDGET_KEY)
        kv_tokens = ROOMY_KV_TOKENS
        if budget_gb is not None:  # the workload's own KV budget, as the served instances had it
            kv_tokens = int(float(budget_gb) * predicted["kv_tokens_per_gb"])
        instance = SimInstance(kv_tokens=kv_tokens, max_rows=64)
        for speed in args.speeds:
            for base_rate in args.rates[workload]:
                rate = base_rate / speed
                for name in args.setups:
                    env = server_env(setups[name], builders[workload].env, bench)
                    admission = build_admission(ModelSettings(scheduler, ROOT, env=env))
                    runs = []
                    for seed in range(bench.seed, bench.seed + args.seeds):
                        arrivals = builders[workload].build(rate, args.duration, seed)
                        runs.append(
                            simulate(
                                admission,
                                instance,
                                at_speed(costs, speed),
                                requests.of([Phase(arrivals)]),
                                arrivals,
                                bench,
                            )
                        )
                    row = {
                        "workload": workload,
                        "speed": speed,
                        "rate": rate,
                        "setup": name,
                        "goodput_rps": float(np.mean([r["goodput_rps"] for r in runs])),
                        "refused": float(np.mean([r["refused"] for r in runs])),
                        "e2e_over_sla_p99": float(np.mean([r["e2e_over_sla_p99"] for r in runs])),
                    }
                    rows.append(row)
                    logger.info(
                        "%s x%.1f at %.2f/s %s: goodput %.2f", workload, speed, rate, name, row["goodput_rps"]
                    )
    return rows


RATIOS = (  # (column, numerator set-up, denominator set-up), shown where both ran
    ("slack pace / fixed", "least_slack", "fixed_pace"),
    ("keeping promises / not", "least_slack", "break_promises"),
    ("default / allowance in reach", "least_slack", "allowance_in_reach"),
)


def table(rows: list[dict], setups: list[str]) -> str:
    labels = {s.name: s.label for s in SETUPS}
    ratios = [r for r in RATIOS if r[1] in setups and r[2] in setups]
    lines = [
        "| workload | step time / live fit's | offered req/s | "
        + " | ".join(f"{labels[name]} goodput (refused) [admitted e2e p99 / SLA]" for name in setups)
        + "".join(f" | {column}" for column, _, _ in ratios)
        + " |",
        "|---|---|---|" + "---|" * (len(setups) + len(ratios)),
    ]
    keyed = {(r["workload"], r["speed"], r["rate"], r["setup"]): r for r in rows}
    for workload, speed, rate in dict.fromkeys((r["workload"], r["speed"], r["rate"]) for r in rows):
        cells = {name: keyed[(workload, speed, rate, name)] for name in setups}
        lines.append(
            f"| {workload} | {speed:g}x | {rate:.2f} | "
            + " | ".join(
                f"{c['goodput_rps']:.2f} ({c['refused']:.0f}) [{c['e2e_over_sla_p99']:.2f}]"
                for c in cells.values()
            )
            + "".join(f" | {_ratio(cells[top], cells[bottom])}" for _, top, bottom in ratios)
            + " |"
        )
    return "\n".join(lines)


def _ratio(row: dict, other: dict) -> str:
    return f"{row['goodput_rps'] / other['goodput_rps']:.2f}" if other["goodput_rps"] else "—"


def plot(rows: list[dict], setups: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = {s.name: s.label for s in SETUPS}
    panels = list(dict.fromkeys((r["workload"], r["speed"]) for r in rows))
    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels), 3.2), squeeze=False)
    for ax, (workload, speed) in zip(axes[0], panels, strict=True):
        for name in setups:
            points = [r for r in rows if (r["workload"], r["speed"], r["setup"]) == (workload, speed, name)]
            ax.plot(
                [p["rate"] for p in points],
                [p["goodput_rps"] for p in points],
                marker="o",
                label=labels[name],
            )
        ax.set_title(f"{workload}, steps {speed:g}x the live fit's", fontsize=9)
        ax.set_xlabel("offered req/s")
        ax.set_ylabel("goodput req/s")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--predict", type=Path, default=ROOT / "results" / "bench_predict.json")
    parser.add_argument("--policies", type=Path, default=ROOT / "results" / "bench_policies.json")
    parser.add_argument("--workloads", nargs="+", default=["infobench", "heavy"], choices=WORKLOADS)
    parser.add_argument(
        "--setups",
        nargs="+",
        default=list(COMPARED),
        choices=[s.name for s in SETUPS if s.name != "triton_batching"],
        help="bench_policies set-ups to simulate",
    )
    parser.add_argument("--speeds", type=float, nargs="+", default=[0.5, 1.0, 2.0])
    parser.add_argument("--infobench-rates", type=float, nargs="+", default=[1.5, 3.0, 4.5, 6.0])
    parser.add_argument("--heavy-rates", type=float, nargs="+", default=[0.75, 1.5, 2.25, 3.0])
    parser.add_argument("--memory-rates", type=float, nargs="+", default=[1.0, 1.5, 2.0, 3.0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of arrivals per run")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "bench_slow_machine.json")
    parser.add_argument("--plot", type=Path, default=ROOT / "docs" / "img" / "bench_slow_machine.png")
    parser.add_argument("--markdown", type=Path, help="also write the table here")
    args = parser.parse_args(argv)
    args.rates = {"infobench": args.infobench_rates, "heavy": args.heavy_rates, "memory": args.memory_rates}
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    rows = run(args)
    text = table(rows, args.setups)
    print(text)
    plot(rows, args.setups, args.plot)
    if args.markdown:
        args.markdown.write_text(text + "\n")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {"args": {k: v for k, v in vars(args).items() if k != "rates"}, "rows": rows},
            indent=2,
            default=str,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

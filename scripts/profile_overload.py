"""Profile the prompt-heavy overload: which admitted requests end late, and what their
instance was doing meanwhile.

bench_policies.py reports the overload's admitted e2e p99 over the SLA; this script runs
that one cell (a set-up on `mixed` at twice its capacity, the overload's seed) on a real
tritonserver and keeps what the table cannot: every answer's times, the decode pace of
the latest ones, and the scheduler's step and cycle counters per instance sampled every
0.25 s (cycle seconds beyond step seconds are what stalled the rows between steps).

    .venv/bin/python scripts/profile_overload.py --setup least_slack --out /tmp/overload.json
    .venv/bin/python scripts/profile_overload.py --setup held_to_b_sla --rate 15.4
    .venv/bin/python scripts/profile_overload.py --workload memory --rate 2.94

Another workload of bench_policies.py (``--workload``) runs the same way, at its own
capacity's multiple or at ``--rate``.
"""

from __future__ import annotations

import argparse
import json
import logging
import threading
import time
import urllib.request
from pathlib import Path

import bench_policies as bp

SAMPLED_METRICS = (
    "specbatch_step_seconds_total",
    "specbatch_cycle_seconds_total",
    "specbatch_running_rows",
    "specbatch_waiting_rows",
    "specbatch_batch_",  # steps, row-steps, tokens and prefilled tokens per batch-size bucket
    "specbatch_b_sla",  # b_SLA and the pace it holds the instance to
)
TIMELINE_STEP_S = 2.0  # seconds between the lines of an instance's pace timeline


def sample_counters(url: str, samples: list, stop: threading.Event) -> None:
    """The scheduler's per-instance counters, every 0.25 s until ``stop``."""
    started = time.monotonic()
    while not stop.is_set():
        try:
            text = urllib.request.urlopen(url, timeout=2).read().decode()
        except OSError:
            text = ""
        lines = [line for line in text.splitlines() if line.startswith(SAMPLED_METRICS)]
        samples.append((time.monotonic() - started, lines))
        stop.wait(0.25)


def instance_value(lines: list[str], name: str, instance: str) -> float | None:
    """A metric's value for one instance, summed over its other labels (buckets)."""
    values = [
        float(line.rsplit(" ", 1)[1])
        for line in lines
        if line.startswith(name + "{") and f'instance="{instance}"' in line
    ]
    return sum(values) if values else None


def pace_timeline(samples: list, instance: str) -> list[str]:
    """One line per TIMELINE_STEP_S of an instance's run: the pace its rows decoded at
    (cycle seconds a step over the tokens a row committed a step) against the pace b_SLA
    held it to, b_SLA, rows a step (and rows sent to the engine still waiting for its KV
    blocks, at the line's end), and prompt tokens prefilled a second: whether b_SLA
    holds the pace it targets, and what the steps spent on prompts meanwhile."""
    names = (
        "specbatch_cycle_seconds_total",
        "specbatch_batch_steps_total",
        "specbatch_batch_row_steps_total",
        "specbatch_batch_tokens_total",
        "specbatch_batch_prefill_tokens_total",
    )
    lines: list[str] = []
    previous = None
    for at_s, rows in samples:
        totals = [instance_value(rows, name, instance) for name in names]
        if None in totals:
            continue
        if previous is not None and at_s - previous[0] < TIMELINE_STEP_S:
            continue
        if previous is not None:
            deltas = (a - b for a, b in zip(totals, previous[1], strict=True))
            cycle_s, steps, row_steps, tokens, prefill = deltas
            span_s = at_s - previous[0]
            pace = cycle_s / steps / (tokens / row_steps) if steps and tokens else float("nan")
            target = instance_value(rows, "specbatch_b_sla_pace_seconds", instance) or float("nan")
            b_sla = instance_value(rows, "specbatch_b_sla", instance) or float("nan")
            waiting = instance_value(rows, "specbatch_waiting_rows", instance) or 0.0
            lines.append(
                f"  {at_s:5.1f} s: {1000 * pace:5.1f} ms a token (b_SLA's pace {1000 * target:5.1f}), "
                f"b_SLA {b_sla:.0f}, {row_steps / max(steps, 1):4.1f} rows a step ({waiting:.0f} waiting), "
                f"{steps / span_s:4.1f} steps/s, {prefill / span_s:5.0f} prompt tokens/s"
            )
        previous = (at_s, totals)
    return lines


def latest_answers(arrivals: list, records: list[dict], args: argparse.Namespace, count: int) -> list[dict]:
    """The ``count`` answers latest against their SLA, with the pace they decoded at."""
    served = [r for r in records if r["id"] is not None]
    for record in served:
        arrival = arrivals[record["id"]]
        record["over_sla"] = record["e2e_s"] / bp.e2e_sla_s(arrival, args)
        tokens = max(1, record["output_tokens"] - 1)
        record["decode_s_per_token"] = (record["e2e_s"] - record["ttft_s"]) / tokens
        record["max_tokens"] = arrival.max_tokens
    return sorted(served, key=lambda r: r["over_sla"])[-count:]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    served = [s.name for s in bp.SETUPS if s.name != bp.TRITON_BATCHING.name]
    parser.add_argument("--setup", default="least_slack", choices=served)
    parser.add_argument("--workload", default="mixed", choices=["infobench", "mixed", "heavy", "memory"])
    parser.add_argument("--rate", type=float, help="offered req/s (default: twice the set-up's capacity)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--latest", type=int, default=10, help="answers to print, latest against their SLA")
    parser.add_argument("--out", type=Path, default=Path("results/profile_overload.json"))
    cli = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    args = argparse.Namespace(
        **bp.QUICK, seed=cli.seed, short_share=0.6, sla_ttft_s=2.0, sla_base_s=0.5, sla_per_token_s=0.01,
        probe_doublings=2, memory_budget_gb=0.01, memory_loads=[1.0], load_reference="least_slack", rounds=1,
    )  # fmt: skip
    workload = next(w for w in bp.workloads(args) if w.name == cli.workload)
    setup = next(s for s in bp.SETUPS if s.name == cli.setup)
    session = bp.Session(setup, f"profile-{setup.name}", workload.env, args)
    try:
        if cli.rate is None:
            rate = bp.PROMPT_HEAVY_LOAD * session.capacity(workload, 10.0)["capacity_rps"]
            session = session.restarted()  # as bench_policies serves its cells
        else:
            rate = cli.rate
        arrivals = workload.build(rate, args.duration, bp.arrival_seed(args, 0, bp.OVERLOAD_SEED_OFFSET))
        samples: list = []
        stop = threading.Event()
        sampler = threading.Thread(target=sample_counters, args=(session.process.metrics_url, samples, stop))
        sampler.start()
        records = bp.drive(session.process.grpc_url, session.setup, arrivals, timeout_s=args.drain)
        stop.set()
        sampler.join()
    finally:
        session.close()
    row = bp.summarise(session.setup, rate, arrivals, records, args)
    print(
        f"{setup.name} at {rate:.2f} req/s: {row['completed']} of {row['offered']} admitted, "
        f"{row['errors']} refused, admitted e2e p99 {row['e2e_over_sla_p99']:.2f}x the SLA, "
        f"goodput {row['goodput_rps']:.2f} req/s"
    )
    for r in latest_answers(arrivals, records, args, cli.latest):
        print(
            f"  {r['over_sla']:.2f}x SLA: {r['output_tokens']} of {r['max_tokens']} tokens, "
            f"{r['input_tokens']} in, first token {r['ttft_s']:.2f} s, end {r['e2e_s']:.2f} s, "
            f"{1000 * r['decode_s_per_token']:.1f} ms a token, {r['instance']}"
        )
    instances = sorted({r["instance"] for r in records if r.get("instance")})
    for instance in instances:
        print(instance)
        print("\n".join(pace_timeline(samples, instance)))
    cli.out.parent.mkdir(parents=True, exist_ok=True)
    cli.out.write_text(json.dumps({"rate": rate, "summary": row, "records": records, "samples": samples}))


if __name__ == "__main__":
    main()

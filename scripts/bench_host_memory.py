"""What keeping freed memory in the process buys a CPU engine (specbatch.decoding.host_memory).

Each round runs the same closed loop twice, each in a fresh interpreter, one with
glibc's default malloc thresholds (``SPECBATCH_KEEP_FREED_MEMORY=0``) and one with the
engine's raised ones, in alternating order: ``--rows`` clients each decode their share
of ``--requests`` requests of the mixed workload (scripts/bench_continuous.py) on one
engine of ``--rows`` rows, after a warm-up request, on ``--threads`` torch threads (1,
as a served ``cpu`` instance computes). Reported per run: seconds, tokens/s,
minor page faults inside the timed window, peak resident memory; per round, the ratio
of the two. One run at a time; about 2 minutes per round at the defaults on 2 cores.

    python scripts/bench_host_memory.py --rounds 4 --out results/bench_host_memory.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from bench_continuous import make_workload
from bench_lookahead import PAIRS, PROMPT_RANGE, load_pair
from tqdm import tqdm

from specbatch.decoding import Engine, GenerationRequest
from specbatch.decoding.host_memory import OPT_OUT_ENV

SETTINGS = {"glibc_defaults": "0", "kept": "1"}


class _Finished:
    """Counts one client's streamed tokens and wakes it when its request ends."""

    def __init__(self) -> None:
        self.tokens = 0
        self.done = threading.Event()

    def on_tokens(self, updates: dict[int, list[int]]) -> None:
        self.tokens += sum(len(tokens) for tokens in updates.values())

    def on_finished(self, key: int, result) -> None:
        self.done.set()


def run_once(args) -> dict:
    """One timed closed loop in this process; the row printed as JSON."""
    torch.set_num_threads(args.threads)
    pair = load_pair(args.pair, args.models)
    engine = Engine(pair, lookahead=args.lookahead, max_rows=args.rows)
    engine.generate([GenerationRequest([5, 6, 7], max_new_tokens=4)])
    jobs = make_workload(pair, args.requests, seed=13, prompt_range=PROMPT_RANGE)
    tokens = [0] * args.rows

    def client(index: int) -> None:
        for job in jobs[index :: args.rows]:
            sink = _Finished()
            engine.submit(GenerationRequest(job.prompt, max_new_tokens=job.new_tokens), sink, key=0)
            sink.done.wait()
            tokens[index] += sink.tokens

    faults_before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    start = time.perf_counter()
    clients = [threading.Thread(target=client, args=(index,)) for index in range(args.rows)]
    for thread in clients:
        thread.start()
    for thread in clients:
        thread.join()
    seconds = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "seconds": seconds,
        "tokens": sum(tokens),
        "tokens_per_s": sum(tokens) / seconds,
        "minor_faults": usage.ru_minflt - faults_before,
        "max_rss_mib": usage.ru_maxrss / 1024,
    }


def run_in_child(setting: str, args) -> dict:
    command = [sys.executable, __file__, "--child", "--pair", args.pair, "--models", str(args.models)]
    command += [
        "--requests",
        str(args.requests),
        "--rows",
        str(args.rows),
        "--lookahead",
        str(args.lookahead),
        "--threads",
        str(args.threads),
    ]
    environment = {**os.environ, OPT_OUT_ENV: SETTINGS[setting]}
    done = subprocess.run(command, env=environment, capture_output=True, text=True, check=True)
    return {"setting": setting, **json.loads(done.stdout.splitlines()[-1])}


def table(rows: list[dict]) -> str:
    lines = [
        "| round | setting | seconds | tokens/s | minor faults | peak RSS (MiB) | kept / defaults |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        ratio = f"{row['ratio']:.2f}x" if "ratio" in row else ""
        lines.append(
            f"| {row['round']} | {row['setting']} | {row['seconds']:.1f} | {row['tokens_per_s']:.0f} "
            f"| {row['minor_faults']:,} | {row['max_rss_mib']:.0f} | {ratio} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", type=Path, default=Path(".models"))
    parser.add_argument("--pair", choices=sorted(PAIRS), default="a70")
    parser.add_argument("--requests", type=int, default=96)
    parser.add_argument("--rows", type=int, default=32, help="engine rows and closed-loop clients")
    parser.add_argument("--lookahead", default="0", help="a fixed K, or goodput")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: a served cpu instance's)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.lookahead = int(args.lookahead) if args.lookahead.isdigit() else args.lookahead
    if args.child:
        print(json.dumps(run_once(args)))
        return
    rows = []
    for round_index in tqdm(range(args.rounds), desc="rounds"):
        order = list(SETTINGS) if round_index % 2 == 0 else list(reversed(SETTINGS))
        runs = {setting: {"round": round_index, **run_in_child(setting, args)} for setting in order}
        runs["kept"]["ratio"] = runs["kept"]["tokens_per_s"] / runs["glibc_defaults"]["tokens_per_s"]
        rows += [runs["glibc_defaults"], runs["kept"]]
    ratios = [row["ratio"] for row in rows if "ratio" in row]
    print(table(rows))
    print(
        f"\nkept / glibc defaults, tokens/s: median {statistics.median(ratios):.2f}x "
        f"({min(ratios):.2f}-{max(ratios):.2f}x over {len(ratios)} rounds)"
    )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        record = {
            "machine": {"cpus": os.cpu_count(), "libc": platform.libc_ver()},
            "args": vars(args) | {"models": str(args.models), "out": str(args.out)},
            "rows": rows,
        }
        args.out.write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()

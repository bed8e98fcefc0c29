"""Greedy agreement per dtype: speculative vs target-only, batched vs alone, compiled vs eager.

float64 is proven token for token by tests/models. In float32 and bfloat16 a result
depends on the shape of each matmul (a verify pass scores K+1 tokens where target-only
decoding scores one; a batch runs B rows; a preempted row's cache is rebuilt by one
prefill; a compiled step fuses kernels and pads to buckets), so a near-tie between the
two largest logits can flip and a row parts from its reference there. This measures how
often and where, so the README states what holds rather than what the algorithm
promises.

For each pair (``tiny``: the embedded default, α ≈ 0.7; ``a90``: the controlled pair
with α ≈ 0.9, so most drafts are accepted) and dtype (float32, bfloat16), greedy, end
of sequence off so every row runs its full budget, fixed K = 4 (the goodput policy
picks K from timings, which would make a run irreproducible):

- reference: each prompt decoded alone, target-only (the target's own greedy output);
- (a) speculative, each prompt alone, against the reference;
- (b) the continuous engine with rows joining a few per step, at most ``max_rows``
  running and a KV pool too small for all of them (rows are preempted and prefilled
  again), target-only and speculative, each against the same mode alone;
- (c) compile mode ``default`` (torch.compile on CPU), speculative, each prompt alone,
  against eager on the first ``--compiled-prompts`` prompts: on 2 cores every padded
  shape takes ~25 s to compile, and each batch bucket adds about 15 shapes, so
  compiled rows run alone (one bucket) and on fewer prompts.

Work runs in ``--workers`` processes of one thread each (a 6-layer 256-wide model
gains nothing from a second thread, a second process halves the wall time).

    python scripts/bench_exactness.py --quick --out results/exactness_quick.json
    python scripts/bench_exactness.py --out results/exactness.json

Prints a markdown table, writes the JSON and draws docs/img/exactness_divergence.png.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from bench_gpu import machine
from bench_specdec import bench_prompts

from specbatch.decoding import Engine, GenerationRequest, GenerationResult, ModelPair, load_model_pair
from specbatch.decoding.tiny import CONTROLLED_ALPHAS, TINY_SPEC, build_controlled_pair, build_tiny_pair
from specbatch.figures import save_figure

logger = logging.getLogger("bench_exactness")

DTYPES = ("float32", "bfloat16")
LOOKAHEAD = 4
MAX_ROWS = 16
POOL_BLOCKS_PER_ROW = 8  # a full row needs 12 blocks of 16 tokens: the pool preempts
JOIN_PER_STEP = 2


@dataclass(frozen=True)
class Config:
    """What every run shares: prompts, budget and where the pairs are."""

    prompts: int
    compiled_prompts: int
    new_tokens: int
    pair_dirs: dict[str, str]
    device: str


PAIRS = ("tiny", "a90")


def pair_dirs(models: Path, names: list[str]) -> dict[str, str]:
    """The named pairs (the tiny pair, the controlled a90 pair on the tiny shapes), built if missing."""
    builders = {
        "tiny": lambda: build_tiny_pair(models / "tiny"),
        "a90": lambda: build_controlled_pair(
            models / "controlled_tiny" / "a90", TINY_SPEC, CONTROLLED_ALPHAS["a90"]
        ),
    }
    return {name: str(builders[name]()[0].parent) for name in names}


def load(config: Config, name: str, dtype: str) -> ModelPair:
    directory = Path(config.pair_dirs[name])
    pair = load_model_pair(
        str(directory / "target"), str(directory / "draft"), device=config.device, dtype=dtype
    )
    pair.eos_token_ids.clear()  # every row runs its full budget, so rows compare position by position
    return pair


def requests(pair: ModelPair, config: Config, count: int) -> list[GenerationRequest]:
    return [GenerationRequest(p, max_new_tokens=config.new_tokens) for p in bench_prompts(pair, count)]


def alone(engine: Engine, batch: list[GenerationRequest], mode: str) -> list[GenerationResult]:
    """Each request decoded with nothing beside it."""
    return [engine.generate([request], mode=mode)[0] for request in batch]


class Staggered:
    """Submits rows ``JOIN_PER_STEP`` at a time from the engine's own loop, so which step
    each row joins at depends on the run alone, never on thread timing."""

    def __init__(self, engine: Engine, batch: list[GenerationRequest], mode: str) -> None:
        self.engine, self.batch, self.mode = engine, batch, mode
        self.results: list[GenerationResult | None] = [None] * len(batch)
        self.submitted = self.finished = 0
        self.done = threading.Event()

    def run(self) -> list[GenerationResult]:
        self._submit_next()
        self.done.wait()
        failed = [r.error for r in self.results if r is not None and r.finish_reason == "error"]
        if failed:
            raise RuntimeError(failed[0])
        return [r for r in self.results if r is not None]

    def _submit_next(self) -> None:
        keys = list(range(self.submitted, min(self.submitted + JOIN_PER_STEP, len(self.batch))))
        self.submitted += len(keys)
        if keys:
            self.engine.submit_many([self.batch[k] for k in keys], self, self.mode, keys=keys)

    def on_tokens(self, updates: dict[int, list[int]]) -> None:
        self._submit_next()

    def on_finished(self, key: int, result: GenerationResult) -> None:
        self.results[key] = result
        self.finished += 1
        if self.finished == len(self.batch):
            self.done.set()
        elif self.finished == self.submitted:  # nothing running: the next rows join now
            self._submit_next()


def batched_engine(pair: ModelPair) -> Engine:
    budget = MAX_ROWS * POOL_BLOCKS_PER_ROW * 16 * pair.kv_bytes_per_token
    return Engine(pair, lookahead=LOOKAHEAD, max_rows=MAX_ROWS, kv_memory_budget_bytes=budget, block_size=16)


def summary(results: list[GenerationResult], seconds: float) -> dict:
    drafted = sum(r.total_draft_tokens for r in results)
    return {
        "tokens": [r.tokens for r in results],
        "acceptance": sum(r.total_accepted_draft_tokens for r in results) / drafted if drafted else None,
        "preempted": [i for i, r in enumerate(results) if r.preemptions],
        "seconds": round(seconds, 1),
    }


def _stage(label: str, function: Callable[..., list[GenerationResult]], *args: object) -> dict:
    """Run one stage of a job, logged as it starts and ends (a full run takes many minutes)."""
    started = time.perf_counter()
    logger.info("%s ...", label)
    out = summary(function(*args), time.perf_counter() - started)
    logger.info("%s done in %.0f s", label, out["seconds"])
    return out


def staggered(pair: ModelPair, batch: list[GenerationRequest], mode: str) -> list[GenerationResult]:
    return Staggered(batched_engine(pair), batch, mode).run()


def eager_job(config: Config, name: str, dtype: str) -> dict[str, dict]:
    """Reference, (a) and (b) for one pair and dtype."""
    pair = load(config, name, dtype)
    batch = requests(pair, config, config.prompts)
    engine = Engine(pair, lookahead=LOOKAHEAD)
    out = {}
    for mode in ("target_only", "speculative"):
        out[f"{mode} alone"] = _stage(f"{name} {dtype} {mode} alone", alone, engine, batch, mode)
    for mode in ("target_only", "speculative"):
        out[f"{mode} batched"] = _stage(f"{name} {dtype} {mode} batched", staggered, pair, batch, mode)
    return out


def compile_mode(device: str) -> str:
    """What (c) compares with eager: torch.compile on a CPU, CUDA graphs on a GPU."""
    return "cuda_graphs" if device.startswith("cuda") else "default"


def compiled_job(config: Config, dtype: str) -> dict[str, dict]:
    """(c) for both pairs in one process: same shapes, so the second reuses the graphs."""
    out = {}
    for name in config.pair_dirs:
        pair = load(config, name, dtype)
        batch = requests(pair, config, config.compiled_prompts)
        engine = Engine(pair, lookahead=LOOKAHEAD, compile=compile_mode(config.device))
        label = f"{name} {dtype} speculative compiled alone"
        out[name] = _stage(label, alone, engine, batch, "speculative")
    return out


def _worker_init() -> None:
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(processName)s %(message)s")
    logging.getLogger("specbatch").setLevel(logging.WARNING)


def first_divergence(ours: list[int], reference: list[int]) -> int | None:
    """The first new-token position where the two outputs differ (None: identical)."""
    for position, (a, b) in enumerate(zip(ours, reference, strict=False)):
        if a != b:
            return position
    return None if len(ours) == len(reference) else min(len(ours), len(reference))


def compare(
    pair: str, dtype: str, comparison: str, ours: dict, baseline: list[list[int]], reference: list[list[int]]
) -> dict:
    """Agreement of the run ``ours`` with ``baseline`` (its own mode alone, or eager) and
    with ``reference`` (target-only alone: what the target itself would have said), row
    by row over the rows ``ours`` ran."""
    rows = len(ours["tokens"])
    positions = {
        i: first_divergence(t, b) for i, (t, b) in enumerate(zip(ours["tokens"], baseline, strict=False))
    }
    divergent = {i: p for i, p in positions.items() if p is not None}
    to_reference = sum(
        first_divergence(t, r) is None for t, r in zip(ours["tokens"], reference, strict=False)
    )
    preempted = ours["preempted"]
    return {
        "pair": pair,
        "dtype": dtype,
        "comparison": comparison,
        "rows": rows,
        "identical": rows - len(divergent),
        "identical_share": (rows - len(divergent)) / rows,
        "first_divergence_median": statistics.median(divergent.values()) if divergent else None,
        "first_divergence_min": min(divergent.values()) if divergent else None,
        "divergent": sorted(divergent.items()),
        "identical_to_target_alone": to_reference,
        "preempted_rows": len(preempted),
        "preempted_identical": sum(i not in divergent for i in preempted),
        "acceptance": ours["acceptance"],
    }


COMPARISONS = (
    ("(a) speculative vs target-only", "speculative alone", "target_only alone"),
    ("(b) batched target-only vs alone", "target_only batched", "target_only alone"),
    ("(b) batched speculative vs alone", "speculative batched", "speculative alone"),
)
COMPILED = "(c) compiled speculative vs eager"


def run(config: Config, workers: int) -> list[dict]:
    with ProcessPoolExecutor(max_workers=workers, initializer=_worker_init) as pool:
        compiled = (
            {dtype: pool.submit(compiled_job, config, dtype) for dtype in DTYPES}
            if config.compiled_prompts
            else {}
        )
        eager = {(n, d): pool.submit(eager_job, config, n, d) for d in DTYPES for n in config.pair_dirs}
        runs = {key: future.result() for key, future in eager.items()}
        compiled_runs = {dtype: future.result() for dtype, future in compiled.items()}
    rows = []
    for (name, dtype), got in runs.items():
        reference = got["target_only alone"]["tokens"]
        for label, ours, baseline in COMPARISONS:
            rows.append(compare(name, dtype, label, got[ours], got[baseline]["tokens"], reference))
        if dtype in compiled_runs:
            eager = got["speculative alone"]["tokens"]
            rows.append(compare(name, dtype, COMPILED, compiled_runs[dtype][name], eager, reference))
    return sorted(rows, key=lambda r: (r["dtype"], r["comparison"], r["pair"]))


def _fmt(value: object) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.0f}" if value == int(value) else f"{value:.1f}"
    return str(value)


def markdown_table(rows: list[dict], new_tokens: int) -> str:
    lines = [
        f"| dtype | comparison | pair | rows × {new_tokens} tokens | identical | first divergence median | "
        "min | identical to target-only alone | preempted rows (identical) | acceptance |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        acceptance = "–" if r["acceptance"] is None else f"{r['acceptance']:.2f}"
        preempted = f"{r['preempted_rows']} ({r['preempted_identical']})" if r["preempted_rows"] else "–"
        lines.append(
            f"| {r['dtype']} | {r['comparison']} | {r['pair']} | {r['rows']} | "
            f"{r['identical']} ({100 * r['identical_share']:.1f} %) | {_fmt(r['first_divergence_median'])} | "
            f"{_fmt(r['first_divergence_min'])} | {r['identical_to_target_alone']} | {preempted} | "
            f"{acceptance} |"
        )
    return "\n".join(lines)


def plot(rows: list[dict], new_tokens: int, device: str, path: Path) -> None:
    """Where first divergences fall, one strip per comparison and pair, a panel per dtype."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = sorted({(r["comparison"], r["pair"]) for r in rows})
    fig, axes = plt.subplots(1, len(DTYPES), figsize=(13, 0.45 * len(labels) + 1.8), sharey=True)
    for ax, dtype in zip(axes, DTYPES, strict=True):
        for y, (comparison, pair) in enumerate(labels):
            row = next(
                (r for r in rows if (r["comparison"], r["pair"], r["dtype"]) == (comparison, pair, dtype)),
                None,
            )
            if row is None:
                continue
            xs = [p for _, p in row["divergent"]]
            ax.scatter(xs, [y] * len(xs), s=14, alpha=0.5)
            ax.annotate(
                f"{100 * row['identical_share']:.0f} % identical", (new_tokens, y), fontsize=7, va="center"
            )
        ax.set_yticks(range(len(labels)), [f"{c} · {p}" for c, p in labels], fontsize=7)
        ax.set_xlim(-2, new_tokens * 1.3)
        ax.set_xlabel("first divergent new-token position (rows that diverge)")
        ax.set_title(dtype)
        ax.grid(alpha=0.3)
    fig.suptitle(f"Greedy agreement on {device.upper()}: where rows first part from their baseline")
    save_figure(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="16 prompts x 32 tokens, 2 compiled (a few minutes)"
    )
    parser.add_argument("--prompts", type=int, help="default 200 (16 with --quick)")
    parser.add_argument("--new-tokens", type=int, help="default 128 (32 with --quick)")
    parser.add_argument("--compiled-prompts", type=int, help="default 12 (2 with --quick); 0 skips (c)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--models", type=Path, default=Path(".models"))
    parser.add_argument("--pairs", nargs="+", choices=PAIRS, default=list(PAIRS))
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]; (c) runs CUDA graphs on a GPU")
    parser.add_argument("--out", type=Path, help="write the rows as JSON here")
    parser.add_argument("--plot", type=Path, default=Path("docs/img/exactness_divergence.png"))
    args = parser.parse_args()
    _worker_init()
    config = Config(
        prompts=args.prompts or (16 if args.quick else 200),
        compiled_prompts=args.compiled_prompts
        if args.compiled_prompts is not None
        else (2 if args.quick else 12),
        new_tokens=args.new_tokens or (32 if args.quick else 128),
        pair_dirs=pair_dirs(args.models, args.pairs),
        device=args.device,
    )
    started = time.perf_counter()
    rows = run(config, args.workers)
    print(
        f"\n## Exactness per dtype ({'quick' if args.quick else 'full'}, {config.prompts} prompts x "
        f"{config.new_tokens} new tokens, compiled on {config.compiled_prompts}, greedy, K = {LOOKAHEAD}, "
        f"{machine(args.device)}, {os.cpu_count()} cores, "
        f"{args.workers} workers x 1 thread, "
        f"{time.perf_counter() - started:.0f} s)\n"
    )
    print(markdown_table(rows, config.new_tokens))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        payload = {"config": {**config.__dict__, "lookahead": LOOKAHEAD, "max_rows": MAX_ROWS}, "rows": rows}
        args.out.write_text(json.dumps(payload, indent=2) + "\n")
    plot(rows, config.new_tokens, args.device, args.plot)
    print(f"\nplot: {args.plot}")


if __name__ == "__main__":
    main()

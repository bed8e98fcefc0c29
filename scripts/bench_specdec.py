"""Speculative decoding against its peers, side by side in one process.

For each controlled-acceptance pair (scripts/build_tiny_models.py), batch size and
temperature it runs: our target_only, our speculative (fixed K chosen from the
pair's calibrated acceptance and the measured cost ratio; optionally adaptive K),
Hugging Face ``generate`` on the target at the same batch, and Hugging Face assisted
generation (``assistant_model=draft``; batch 1 only, so prompt by prompt). Every row
generates exactly ``--new-tokens`` tokens (end-of-sequence disabled everywhere) so
tokens/s compare like for like.

Every mode is built and warmed before anything is timed: each one first runs an untimed
round identical to its timed ones (our engines' start-up cost calibration, first-call
allocations and lazy initialisation all happen there), whatever ``--runs``. Each timed
window holds one generation and nothing else. The modes then take turns over ``--runs``
rounds (the order rotating each round); a row reports the median run and the spread
(slowest and fastest run), and a speedup the median of the per-round ratios with their
spread. ``decode`` is the same ratio over decode time alone (from the step in which
every row has its first token to the last step, from the engine's step callbacks), the
figure the analytical speedup is compared with. Our engines run with prefix caching
off, so a round never reuses the prompt blocks an earlier round computed (Hugging Face
recomputes every prompt too).

    python scripts/bench_specdec.py --quick --out results/specdec_quick.json
    python scripts/bench_specdec.py --out results/specdec.json

Prints a markdown table, writes the JSON rows and draws docs/img/specdec_speedup.png.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import math
import os
import platform
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from specbatch.acceptance import acceptance_rate
from specbatch.decoding import Engine, GenerationRequest, ModelPair, load_model_pair
from specbatch.decoding.host_memory import keep_freed_memory
from specbatch.decoding.kv_blocks import dense_pool, layout_for
from specbatch.decoding.tiny import CONTROLLED_ALPHAS, build_benchmark_pairs
from specbatch.decoding.tokenizer_build import corpus
from specbatch.figures import save_figure

logger = logging.getLogger("bench_specdec")


@dataclass
class Setting:
    pair: str
    batch: int
    temperature: float


def analytical_speedup(alpha: float, lookahead: int, cost_ratio: float) -> float:
    """Expected speedup of speculative decoding (Leviathan et al., eq. 1)."""
    if alpha >= 1.0:
        return (lookahead + 1) / (lookahead * cost_ratio + 1)
    return (1 - alpha ** (lookahead + 1)) / ((1 - alpha) * (lookahead * cost_ratio + 1))


def alpha_from_tokens_per_pass(tokens_per_pass: float, lookahead: int) -> float:
    """Invert E[tokens per target pass] = (1 - α^(K+1)) / (1 - α) by bisection."""
    low, high = 0.0, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        expected = lookahead + 1 if mid >= 1 else (1 - mid ** (lookahead + 1)) / (1 - mid)
        if expected < tokens_per_pass:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def bench_prompts(pair: ModelPair, count: int) -> list[list[int]]:
    lines = corpus(lines=count, seed=2024)
    return [pair.tokenizer.encode(line, add_special_tokens=False)[:48] for line in lines]


def _time_forward(model, batch: int, tokens: int, context: int, repeats: int) -> float:
    pool, tables = dense_pool(batch, context + tokens + 1, block_size=16)
    store = model.new_store(pool.num_slots)
    prefix = torch.randint(3, 500, (batch, context))
    prefix_positions = torch.arange(context).expand(batch, context)
    everything = torch.ones(batch, context, dtype=torch.bool)
    model.fill(prefix, prefix_positions, store, layout_for(tables, prefix_positions, everything, pool))
    feed = torch.randint(3, 500, (batch, tokens))
    positions = (context + torch.arange(tokens)).expand(batch, tokens)
    layout = layout_for(tables, positions, torch.ones(batch, tokens, dtype=torch.bool), pool)
    last = torch.full((batch, 1), tokens - 1)
    model(feed, positions, store, layout, last)
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        model(feed, positions, store, layout, last)
        best = min(best, time.perf_counter() - start)
    return best


def measure_costs(pair: ModelPair, batch: int, repeats: int) -> dict:
    """Pass times at this batch: c = draft pass / target pass (one token per row), and
    v(K) = a target pass over K+1 tokens per row (a verify pass) / a one-token pass.

    Timed on a worker thread, because the engine runs its passes on its loop thread:
    on this CPU torch runs small matmuls markedly slower on a thread other than the
    main one, so costs timed on the main thread would not be the engine's."""

    def measure() -> dict:
        with torch.inference_mode():
            target = _time_forward(pair.target, batch, 1, 64, repeats)
            draft = _time_forward(pair.draft, batch, 1, 64, repeats)
            verify = {k: _time_forward(pair.target, batch, k + 1, 64, repeats) / target for k in range(1, 9)}
        return {"cost_ratio": draft / target, "verify_cost": verify, "target_pass_s": target}

    result: list[dict] = []
    worker = threading.Thread(target=lambda: result.append(measure()), name="bench-costs")
    worker.start()
    worker.join()
    if not result:
        raise RuntimeError("measuring pass costs failed (see the traceback above)")
    return result[0]


def tokens_per_pass(alpha: float, lookahead: int) -> float:
    if alpha >= 1.0:
        return lookahead + 1.0
    return (1 - alpha ** (lookahead + 1)) / (1 - alpha)


def best_lookahead(alpha: float, costs: dict) -> int:
    """K maximising the expected speedup once a verify pass costs what it measured."""
    c, verify = costs["cost_ratio"], costs["verify_cost"]
    return max(range(1, 9), key=lambda k: tokens_per_pass(alpha, k) / (k * c + verify[k]))


def warmed_rounds(runs: int, tasks: dict[str, tuple]) -> dict[str, list[tuple]]:
    """Run every task (``(function, *args)`` returning ``(seconds, payload)``) once
    untimed, then ``runs`` rounds in which every task runs once, the order rotating
    from round to round; each task's outcomes in round order. The warm-up round pays
    every one-off cost (calibration, first-call allocation, lazy initialisation) before
    any timed run, and taking turns spreads a burst of foreign load on a shared machine
    over all modes."""
    names = list(tasks)
    for name in names:
        function, *args = tasks[name]
        function(*args)
    outcomes: dict[str, list[tuple]] = {name: [] for name in names}
    for round_index in range(runs):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            function, *args = tasks[name]
            outcomes[name].append(function(*args))
    return outcomes


def median_index(values: list[float]) -> int:
    """The index of the median value (the lower middle one for an even count)."""
    order = sorted(range(len(values)), key=values.__getitem__)
    return order[(len(values) - 1) // 2]


def spread(values: list[float]) -> tuple[float, float, float]:
    """(median, lowest, highest); the median of an even count is the mean of the middle two."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    median = ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
    return median, ordered[0], ordered[-1]


class DecodeSpan:
    """The decode part of one ``Engine.generate`` call, from its step callbacks: from the
    step in which the last of its rows committed its first token (every prompt
    prefilled by then) to its last step, and the tokens committed after the first."""

    def __init__(self, rows: int) -> None:
        self._rows = rows
        self._seen: set[int] = set()
        self._start: float | None = None
        self._end: float | None = None
        self._tokens = 0

    def __call__(self, updates: dict[int, list[int]]) -> None:
        now = time.perf_counter()
        if self._start is None:
            self._seen.update(updates)
            if len(self._seen) == self._rows:
                self._start = now
            return
        self._tokens += sum(len(tokens) for tokens in updates.values())
        self._end = now

    @property
    def tokens_per_s(self) -> float:
        if self._start is None or self._end is None:
            return math.nan
        return self._tokens / (self._end - self._start)


def run_ours(engine: Engine, prompts, setting: Setting, new_tokens: int, mode: str) -> tuple[float, tuple]:
    requests = [
        GenerationRequest(p, max_new_tokens=new_tokens, temperature=setting.temperature) for p in prompts
    ]
    decode = DecodeSpan(len(requests))
    start = time.perf_counter()
    results = engine.generate(requests, mode=mode, on_step=decode)
    return time.perf_counter() - start, (results, decode.tokens_per_s)


def _generation_config(model, new_tokens: int, temperature: float, pad_id: int):
    config = copy.deepcopy(model.generation_config)
    config.eos_token_id = None
    config.pad_token_id = pad_id
    config.max_new_tokens = new_tokens
    config.min_new_tokens = None
    config.do_sample = temperature > 0
    config.temperature = temperature if temperature > 0 else None
    config.top_k = None
    config.top_p = None
    return config


def run_hf_generate(pair: ModelPair, prompts, setting: Setting, new_tokens: int) -> tuple[float, int]:
    pad_id = pair.tokenizer.pad_token_id
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    config = _generation_config(pair.hf_target, new_tokens, setting.temperature, pad_id)
    torch.manual_seed(0)
    start = time.perf_counter()
    with torch.inference_mode():
        out = pair.hf_target.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    seconds = time.perf_counter() - start
    return seconds, (out.shape[1] - width) * len(prompts)


def run_hf_assisted(pair: ModelPair, prompts, setting: Setting, new_tokens: int) -> tuple[float, int]:
    pad_id = pair.tokenizer.pad_token_id
    config = _generation_config(pair.hf_target, new_tokens, setting.temperature, pad_id)
    torch.manual_seed(0)
    produced = 0
    start = time.perf_counter()
    with torch.inference_mode():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            out = pair.hf_target.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                assistant_model=pair.hf_draft,
                generation_config=config,
            )
            produced += out.shape[1] - len(prompt)
    return time.perf_counter() - start, produced


def our_engine(pair: ModelPair, lookahead: int | str, batch: int) -> Engine:
    """An engine for one row of the table: a pool for ``batch`` rows, prefix caching off
    (every round computes its prompts whole, as Hugging Face does)."""
    return Engine(pair, lookahead=lookahead, max_rows=batch, prefix_caching=False)


def timed_row(base: dict, mode: str, tokens_per_run: list[float], seconds: list[float]) -> dict:
    """The fields every row has: median tok/s over the rounds and its spread."""
    rates = [tokens / s for tokens, s in zip(tokens_per_run, seconds, strict=True)]
    median, low, high = spread(rates)
    return {
        **base,
        "mode": mode,
        "tokens_per_s": median,
        "tokens_per_s_min": low,
        "tokens_per_s_max": high,
        "seconds": spread(seconds)[0],
        "runs": len(rates),
    }


def with_speedup(row: dict, rates: list[float], plain_rates: list[float]) -> dict:
    """Speedup over our target_only: the median of the per-round ratios and their spread."""
    ratios = [r / p for r, p in zip(rates, plain_rates, strict=True)]
    row["measured_speedup"], row["speedup_min"], row["speedup_max"] = spread(ratios)
    return row


def bench_pair(name: str, pair_dir: Path, args, record: dict) -> list[dict]:
    pair = load_model_pair(str(pair_dir / "target"), str(pair_dir / "draft"))
    pair.eos_token_ids.clear()  # every row runs its full budget
    prompts_all = bench_prompts(pair, max(args.batches))
    rows: list[dict] = []
    costs_by_batch = {batch: measure_costs(pair, batch, args.repeats) for batch in args.batches}
    for temperature in args.temperatures:
        calibrated = (
            record["measured_alpha_greedy"] if temperature == 0 else record["measured_alpha_temperature_0.7"]
        )
        for batch in args.batches:
            setting = Setting(name, batch, temperature)
            prompts = prompts_all[:batch]
            costs = costs_by_batch[batch]
            lookahead = best_lookahead(calibrated, costs)
            base = {"pair": name, "batch": batch, "temperature": temperature, "new_tokens": args.new_tokens}
            logger.info(
                "%s batch=%d T=%.1f K=%d c=%.3f", name, batch, temperature, lookahead, costs["cost_ratio"]
            )

            modes = [("speculative", our_engine(pair, lookahead, batch))]
            if args.adaptive:
                modes.append(("speculative_adaptive", our_engine(pair, "goodput", batch)))
            tasks = {
                "target_only": (
                    run_ours,
                    our_engine(pair, "goodput", batch),
                    prompts,
                    setting,
                    args.new_tokens,
                    "target_only",
                )
            }
            for mode, engine in modes:
                tasks[mode] = (run_ours, engine, prompts, setting, args.new_tokens, "speculative")
            tasks["hf_generate"] = (run_hf_generate, pair, prompts, setting, args.new_tokens)
            if not args.skip_assisted:
                tasks["hf_assisted"] = (run_hf_assisted, pair, prompts, setting, args.new_tokens)
            outcomes = warmed_rounds(args.runs, tasks)

            plain_runs = outcomes["target_only"]
            plain_seconds = [seconds for seconds, _ in plain_runs]
            plain_tokens = [sum(r.num_output_tokens for r in results) for _, (results, _) in plain_runs]
            plain_rates = [t / s for t, s in zip(plain_tokens, plain_seconds, strict=True)]
            plain = plain_runs[median_index(plain_rates)][1][0]
            plain_decode = [decode for _, (_, decode) in plain_runs]
            rows.append(timed_row(base, "target_only", plain_tokens, plain_seconds))
            for mode, _ in modes:
                runs = outcomes[mode]
                seconds = [s for s, _ in runs]
                produced_per_run = [sum(r.num_output_tokens for r in results) for _, (results, _) in runs]
                rates = [t / s for t, s in zip(produced_per_run, seconds, strict=True)]
                spec = runs[median_index(rates)][1][0]
                decode = [d / p for (_, (_, d)), p in zip(runs, plain_decode, strict=True)]
                drafted = sum(r.total_draft_tokens for r in spec)
                accepted = sum(r.total_accepted_draft_tokens for r in spec)
                produced = sum(r.num_output_tokens for r in spec)
                row = with_speedup(timed_row(base, mode, produced_per_run, seconds), rates, plain_rates)
                row["acceptance_rate"] = acceptance_rate(drafted, accepted)
                row["cost_ratio"] = costs["cost_ratio"]
                row["decode_speedup"] = spread(decode)[0]
                if mode == "speculative":
                    steps = drafted / lookahead / batch
                    row["lookahead"] = lookahead
                    row["tokens_per_target_pass"] = produced / batch / steps
                    row["alpha"] = alpha_from_tokens_per_pass(row["tokens_per_target_pass"], lookahead)
                    row["verify_cost"] = costs["verify_cost"][lookahead]
                    row["analytical_speedup"] = analytical_speedup(
                        row["alpha"], lookahead, costs["cost_ratio"]
                    )
                    row["analytical_with_verify_cost"] = row["tokens_per_target_pass"] / (
                        lookahead * costs["cost_ratio"] + row["verify_cost"]
                    )
                    # the formula models decode steps only, so it is compared with decode time
                    row["measured_over_analytical"] = row["decode_speedup"] / row["analytical_speedup"]
                if temperature == 0:
                    row["exact"] = [r.tokens for r in spec] == [r.tokens for r in plain]
                rows.append(row)
            for mode in ("hf_generate", "hf_assisted"):
                if mode in outcomes:
                    seconds = [s for s, _ in outcomes[mode]]
                    produced_per_run = [p for _, p in outcomes[mode]]
                    rates = [t / s for t, s in zip(produced_per_run, seconds, strict=True)]
                    rows.append(
                        with_speedup(timed_row(base, mode, produced_per_run, seconds), rates, plain_rates)
                    )
            for row in rows[-len(tasks) :]:
                logger.info(
                    "  %-22s %8.1f tok/s (%.1f-%.1f)",
                    row["mode"],
                    row["tokens_per_s"],
                    row["tokens_per_s_min"],
                    row["tokens_per_s_max"],
                )
    return rows


def _fmt(value, digits: int = 2) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _range(row: dict, low: str, high: str, digits: int) -> str:
    if row.get(low) is None or row.get("runs", 1) < 2:
        return "–"
    return f"{row[low]:.{digits}f}–{row[high]:.{digits}f}"


def markdown_table(rows: list[dict]) -> str:
    columns = [
        ("pair", "pair"),
        ("batch", "batch"),
        ("temperature", "T"),
        ("mode", "mode"),
        ("tokens_per_s", "tok/s"),
        (lambda r: _range(r, "tokens_per_s_min", "tokens_per_s_max", 1), "tok/s range"),
        ("acceptance_rate", "accept"),
        ("alpha", "α"),
        ("lookahead", "K"),
        ("tokens_per_target_pass", "tok/pass"),
        ("cost_ratio", "c"),
        ("verify_cost", "v(K)"),
        ("analytical_speedup", "analytical"),
        ("analytical_with_verify_cost", "anal. w/ v(K)"),
        ("measured_speedup", "measured"),
        (lambda r: _range(r, "speedup_min", "speedup_max", 2), "measured range"),
        ("decode_speedup", "decode"),
        ("measured_over_analytical", "meas/anal"),
        ("exact", "exact"),
    ]
    lines = ["| " + " | ".join(title for _, title in columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        cells = [key(row) if callable(key) else _fmt(row.get(key)) for key, _ in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def comparisons(rows: list[dict]) -> list[str]:
    """The issue's targets, ours against the peers in this run."""
    index = {(r["pair"], r["batch"], r["temperature"], r["mode"]): r for r in rows}
    out = []
    for (pair, batch, temperature, mode), row in sorted(index.items()):
        if mode != "speculative":
            continue
        key = (pair, batch, temperature)
        assisted = index.get((*key, "hf_assisted"))
        hf = index.get((*key, "hf_generate"))
        plain = index[(*key, "target_only")]
        measured = f"{row['measured_speedup']:.2f}x"
        if row.get("runs", 1) > 1:
            measured += f" ({row['speedup_min']:.2f}-{row['speedup_max']:.2f})"
        parts = [f"{pair} b={batch} T={temperature}: spec/target_only {measured}"]
        parts.append(
            f"decode {row['decode_speedup']:.2f}x, decode/analytical {row['measured_over_analytical']:.2f}"
        )
        if assisted:
            parts.append(f"spec/hf_assisted {row['tokens_per_s'] / assisted['tokens_per_s']:.2f}x")
        if hf:
            parts.append(f"target_only/hf_generate {plain['tokens_per_s'] / hf['tokens_per_s']:.2f}x")
        out.append("; ".join(parts))
    return out


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spec = [r for r in rows if r["mode"] == "speculative"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, temperature in zip(axes, sorted({r["temperature"] for r in spec}), strict=False):
        for batch in sorted({r["batch"] for r in spec}):
            points = sorted(
                (
                    r["alpha"],
                    r["measured_speedup"],
                    r["analytical_speedup"],
                    r["speedup_min"],
                    r["speedup_max"],
                )
                for r in spec
                if r["batch"] == batch and r["temperature"] == temperature
            )
            if not points:
                continue
            xs, measured, analytical, low, high = zip(*points, strict=True)
            errors = [
                [m - lo for m, lo in zip(measured, low, strict=True)],
                [hi - m for m, hi in zip(measured, high, strict=True)],
            ]
            line = ax.errorbar(
                xs,
                measured,
                yerr=errors,
                fmt="o-",
                capsize=3,
                label=f"batch {batch} measured (median, range)",
            )[0]
            ax.plot(
                xs, analytical, "x--", color=line.get_color(), alpha=0.6, label=f"batch {batch} analytical"
            )
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_title(f"temperature {temperature}")
        ax.set_xlabel("per-token acceptance α (from tokens per target pass)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("speedup over our target_only (tok/s ratio)")
    axes[0].legend(fontsize=7)
    fig.suptitle("Speculative decoding on CPU: controlled pairs (target = draft + ε-scaled layers)")
    save_figure(fig, path, dpi=110)


def _commit() -> str:
    """The short commit hash of the checkout this runs from, ``-dirty`` if it has changes."""
    root = Path(__file__).resolve().parents[1]
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True)
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True, text=True
    )
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="fewer tokens, batches and rounds (about 3 minutes on 2 cores)"
    )
    parser.add_argument("--models", type=Path, default=Path(".models/controlled"))
    parser.add_argument("--pairs", nargs="+", default=list(CONTROLLED_ALPHAS))
    parser.add_argument("--batches", nargs="+", type=int, help="default 1 4 8 (1 8 with --quick)")
    parser.add_argument("--temperatures", nargs="+", type=float, default=[0.0, 0.7])
    parser.add_argument("--new-tokens", type=int, default=None, help="default 128 (32 with --quick)")
    parser.add_argument("--adaptive", action="store_true", help="also run speculative with adaptive K")
    parser.add_argument("--skip-assisted", action="store_true", help="skip HF assisted generation")
    parser.add_argument(
        "--runs",
        type=int,
        help="timed rounds per row after the warm-up round, median reported (default 3; 1 with --quick)",
    )
    parser.add_argument("--out", type=Path, help="write the rows as JSON here")
    parser.add_argument("--plot", type=Path, default=Path("docs/img/specdec_speedup.png"))
    args = parser.parse_args()
    if args.new_tokens is None:
        args.new_tokens = 32 if args.quick else 128
    args.batches = args.batches or ([1, 8] if args.quick else [1, 4, 8])
    args.repeats = 2 if args.quick else 5  # timed passes per cost measurement (fastest kept)
    keep_freed_memory()  # before any peer runs: Hugging Face's rows get what our engines get
    if args.runs is None:
        args.runs = 1 if args.quick else 3
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("specbatch").setLevel(logging.WARNING)
    torch.manual_seed(0)

    commit, date = _commit(), time.strftime("%Y-%m-%d", time.gmtime())
    built = build_benchmark_pairs(args.models)
    started = time.perf_counter()
    rows: list[dict] = []
    for name in args.pairs:
        pair_dir = built[name][0].parent
        record = json.loads((pair_dir / "controlled.json").read_text())
        rows.extend(bench_pair(name, pair_dir, args, record))

    print(
        f"\n## Speculative decoding benchmark ({'quick' if args.quick else 'full'}, commit {commit}, "
        f"{date}, {args.new_tokens} new tokens, "
        f"1 warm-up + {args.runs} timed round(s), {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores, {torch.get_num_threads()} threads, "
        f"{time.perf_counter() - started:.0f} s)\n"
    )
    print("`python " + " ".join(sys.argv) + "`\n")
    print(markdown_table(rows))
    print("\n" + "\n".join(f"- {line}" for line in comparisons(rows)))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(rows, indent=2) + "\n")
    plot(rows, args.plot)
    print(f"\nplot: {args.plot}")


if __name__ == "__main__":
    main()

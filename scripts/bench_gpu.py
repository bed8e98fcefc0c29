"""The GPU fast path measured: eager against compiled, near the memory-bandwidth limit.

For each compile mode (CPU: ``none`` and ``default``; CUDA: ``none`` and
``cuda_graphs``) it reports, through the engine's real decode path:
- target-only tokens/s at batch 1, 8 and 32, against the bandwidth limit
  (batch x bandwidth / bytes of target weights: every decode step reads all weights);
- the draft/target cost ratio c (a draft-only step over a target-only step, batch 1);
- speculative decoding with the draft = the target (acceptance α = 1, so every step
  commits K + 1 tokens) for K = 1..8, from which the verify cost v(K) follows: a step
  costs K draft passes plus one verify pass, all of one model, so
  v(K) = step time / plain step time - K, in units of a one-token pass (the plain steps
  timed in turn with the speculative ones, the median over rounds);
- the goodput policy at batch 1, 8 and 32 over the target-only rate (``x plain``: the
  median of the rounds' ratios; target-only, draft-only and goodput take turns round by
  round at each batch), with the steps it ran per K: on the random-weight CUDA pair the
  draft is independent of the target (acceptance near 0), so it must switch speculation
  off and match plain decoding.

``--device cpu --quick``: the embedded tiny pair (``.models/tiny``, built if missing).
``--device cuda``: random-initialised Qwen3-8B and Qwen3-0.6B shapes in bf16 (configs
from :mod:`specbatch.decoding.production_shapes`, a tokenizer of Qwen3's size, nothing
downloaded). Decode throughput is timed between the engine's step
callbacks after the first step, so prefill and compilation are left out; every mode
first runs the same workload once untimed to compile and capture.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specbatch.decoding import Engine, GenerationRequest, ModelPair, load_model_pair, pair_from_models  # noqa: E402
from specbatch.decoding.compiled import COMPILE_MODES  # noqa: E402
from specbatch.decoding.production_shapes import QWEN3_0_6B, QWEN3_8B, qwen3_config  # noqa: E402
from specbatch.decoding.tiny import build_tiny_pair  # noqa: E402
from specbatch.decoding.tokenizer_build import build_qwen3_sized_tokenizer  # noqa: E402
from specbatch.figures import save_figure  # noqa: E402

# Peak memory bandwidth (bytes/s) by device name, from the vendors' data sheets.
GPU_BANDWIDTH = {"H100 80GB HBM3": 3.35e12, "H100": 3.35e12, "H200": 4.8e12, "A100": 2.0e12}

BATCHES = (1, 8, 32)
LOOKAHEADS = tuple(range(1, 9))
PROMPT_TOKENS = 16


@dataclass(frozen=True)
class DecodeRun:
    """How long each measured point decodes (plain and speculative) and how often it is timed."""

    new_tokens: int
    spec_tokens: int
    repeats: int  # timed runs per point; the median is reported (a shared machine is noisy)


def full_size_qwen3(shape: dict, device: torch.device) -> torch.nn.Module:
    """A Qwen3ForCausalLM of a published ``shape`` (its 151,936-row vocabulary included),
    with random bf16 weights, built on the device: only the bytes a pass reads matter here,
    not the seeded, scaled weights of the checkpoints `specbatch build-models` writes."""
    from transformers import Qwen3ForCausalLM

    with torch.device(device):
        model = Qwen3ForCausalLM(qwen3_config(shape)).to(torch.bfloat16)
    for param in model.parameters():
        param.data.normal_(0.0, 0.02)
    return model.eval()


def load_pairs(device: torch.device, scratch: Path) -> tuple[ModelPair, ModelPair, str]:
    """(the target + draft pair, the pair whose draft is the target itself, a label)."""
    if device.type == "cpu":
        target_dir, draft_dir = build_tiny_pair(ROOT / ".models" / "tiny")
        pair = load_model_pair(str(target_dir), str(draft_dir), device="cpu")
        same = pair_from_models(pair.hf_target, pair.hf_target, pair.tokenizer)
        return pair, same, "tiny pair (.models/tiny), float32"
    from transformers import AutoTokenizer

    build_qwen3_sized_tokenizer(scratch)
    tokenizer = AutoTokenizer.from_pretrained(scratch)
    target = full_size_qwen3(QWEN3_8B, device)
    draft = full_size_qwen3(QWEN3_0_6B, device)
    pair = pair_from_models(target, draft, tokenizer)
    same = pair_from_models(target, target, tokenizer)
    return pair, same, "random-initialised Qwen3-8B / Qwen3-0.6B shapes, bf16"


def weight_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def memory_bandwidth(device: torch.device) -> float:
    """Peak bytes/s: the data sheet on a GPU, a measured large copy on the CPU."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, value in GPU_BANDWIDTH.items():
            if key in name:
                return value
        raise SystemExit(f"no bandwidth figure for {name!r}; add it to GPU_BANDWIDTH")
    source = torch.ones(64 * 2**20)  # 256 MiB, far past the caches
    target = torch.empty_like(source)
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        target.copy_(source)
        best = min(best, time.perf_counter() - started)
    return 2 * source.numel() * source.element_size() / best  # read + write


def decode_rate(engine: Engine, batch: int, new_tokens: int, mode: str) -> float:
    """Committed tokens per second between the first and the last decode step."""
    prompts = [[3 + (row * 7 + i) % 500 for i in range(PROMPT_TOKENS)] for row in range(batch)]
    requests = [GenerationRequest(p, max_new_tokens=new_tokens) for p in prompts]
    stamps: list[tuple[float, int]] = []

    def on_step(updates: dict[int, list[int]]) -> None:
        stamps.append((time.perf_counter(), sum(len(t) for t in updates.values())))

    engine.generate(requests, mode=mode, on_step=on_step)
    if len(stamps) < 2:
        raise RuntimeError("too few decode steps to time; raise the token count")
    tokens = sum(count for _, count in stamps[1:])
    return tokens / (stamps[-1][0] - stamps[0][0])


def rates_in_turn(
    engines: dict[str, tuple[Engine, str]], batch: int, new_tokens: int, repeats: int
) -> dict[str, list[float]]:
    """Each engine's decode rates (``engines``: name to engine and mode) over ``repeats``
    rounds in which every engine runs once, the order rotating, after one untimed run
    each. Set-ups compared by a ratio take turns: timed one after the other, a shared
    machine's drift between them read as their difference (goodput measured after
    target-only read 0.83x it at batch 32 on the CPU, and 0.97x taking turns)."""
    for engine, mode in engines.values():
        decode_rate(engine, batch, new_tokens, mode)
    names = list(engines)
    rates: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(repeats):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            engine, mode = engines[name]
            rates[name].append(decode_rate(engine, batch, new_tokens, mode))
    return rates


def machine(device: str) -> str:
    """The device's name as the tables report it: the GPU's, or the CPU's."""
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return platform.processor() or platform.machine()


def measure(
    pair: ModelPair, same: ModelPair, compile: str, work: DecodeRun, device: str, limits: dict
) -> Iterator[dict]:
    """Each row as it is measured."""

    def row(kind: str, batch: int, lookahead: int | None, rate: float, **extra: object) -> dict:
        return {
            "device": device,
            "compile": compile,
            "kind": kind,
            "batch": batch,
            "lookahead": lookahead,
            "tokens_per_s": rate,
            "bandwidth_limit_tokens_per_s": limits[batch],
            "bandwidth_fraction": rate / limits[batch],
            "cost_ratio": None,
            "verify_cost": None,
            **extra,
        }

    for batch in BATCHES:
        engines = {
            "target_only": (Engine(pair, lookahead=0, compile=compile, max_rows=batch), "target_only"),
            "draft_only": (Engine(pair, lookahead=0, compile=compile, max_rows=batch), "draft_only"),
            "goodput": (Engine(pair, lookahead="goodput", compile=compile, max_rows=batch), "speculative"),
        }
        rates = rates_in_turn(engines, batch, work.new_tokens, work.repeats)
        rate = statistics.median(rates["target_only"])
        yield row("target_only", batch, 0, rate, cost_ratio=rate / statistics.median(rates["draft_only"]))
        yield row(
            "goodput",
            batch,
            None,
            statistics.median(rates["goodput"]),
            over_target_only=statistics.median(
                g / t for g, t in zip(rates["goodput"], rates["target_only"], strict=True)
            ),
            steps_by_lookahead=engines["goodput"][0].lookahead_steps,
        )
    plain_engine = Engine(same, lookahead=0, compile=compile, max_rows=1)
    for k in LOOKAHEADS:
        engines = {
            "target_only": (plain_engine, "target_only"),
            "speculative": (Engine(same, lookahead=k, compile=compile, max_rows=1), "speculative"),
        }
        rates = rates_in_turn(engines, 1, work.spec_tokens, work.repeats)
        # seconds per step over seconds per plain step, round by round
        steps_over_plain = [
            (k + 1) * plain / speculative
            for plain, speculative in zip(rates["target_only"], rates["speculative"], strict=True)
        ]
        rate = statistics.median(rates["speculative"])
        yield row("speculative_alpha1", 1, k, rate, verify_cost=statistics.median(steps_over_plain) - k)


def table(rows: list[dict], modes: list[str]) -> str:
    """Markdown: one line per measurement, the modes side by side."""
    by_key = {(r["kind"], r["batch"], r["lookahead"], r["compile"]): r for r in rows}
    keys = sorted(
        {(r["kind"], r["batch"], r["lookahead"]) for r in rows}, key=lambda k: (k[0] != "target_only", k)
    )
    header = ["measure", "batch", "K"]
    for mode in modes:
        header += [f"tok/s {mode}", f"of limit {mode}", f"c / v(K) / x plain {mode}"]
    header.append("speed-up")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for kind, batch, k in keys:
        cells = [kind.replace("_", " "), str(batch), "–" if k is None else str(k)]
        rates = []
        for mode in modes:
            row = by_key[kind, batch, k, mode]
            extra = {"target_only": row["cost_ratio"], "goodput": row.get("over_target_only")}.get(
                kind, row["verify_cost"]
            )
            cells += [f"{row['tokens_per_s']:.1f}", f"{row['bandwidth_fraction']:.1%}", f"{extra:.2f}"]
            rates.append(row["tokens_per_s"])
        cells.append(f"{rates[-1] / rates[0]:.2f}x")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows: list[dict], modes: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for mode in modes:
        plain = [r for r in rows if r["compile"] == mode and r["kind"] == "target_only"]
        left.plot([r["batch"] for r in plain], [r["tokens_per_s"] for r in plain], marker="o", label=mode)
        spec = [r for r in rows if r["compile"] == mode and r["kind"] == "speculative_alpha1"]
        right.plot([r["lookahead"] for r in spec], [r["verify_cost"] for r in spec], marker="o", label=mode)
    limit = [r for r in rows if r["compile"] == modes[0] and r["kind"] == "target_only"]
    left.plot(
        [r["batch"] for r in limit],
        [r["bandwidth_limit_tokens_per_s"] for r in limit],
        "k--",
        label="bandwidth limit",
    )
    left.set(
        xscale="log", yscale="log", xlabel="batch", ylabel="target-only tokens/s", title="Decode throughput"
    )
    right.set(xlabel="K", ylabel="v(K), one-token passes", title="Verify cost (draft = target)")
    left.legend()
    right.legend()
    save_figure(figure, path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--quick", action="store_true", help="fewer tokens per measurement")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "bench_gpu.json")
    parser.add_argument("--plot", type=Path, default=None, help="PNG of throughput and verify cost")
    parser.add_argument(
        "--modes", nargs="+", choices=COMPILE_MODES, help="compile modes in order (default: eager, compiled)"
    )
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    modes = args.modes or (["none", "default"] if device.type == "cpu" else ["none", "cuda_graphs"])
    work = DecodeRun(24, 27, repeats=3) if args.quick else DecodeRun(96, 108, repeats=5)
    scratch = args.out.parent / "bench_gpu_tokenizer"
    scratch.mkdir(parents=True, exist_ok=True)
    pair, same, label = load_pairs(device, scratch)
    bandwidth = memory_bandwidth(device)
    weights = weight_bytes(pair.hf_target)
    limits = {batch: batch * bandwidth / weights for batch in BATCHES}
    report = {
        "models": label,
        "machine": f"{machine(args.device)}, {torch.get_num_threads()} threads, torch {torch.__version__}",
        "bandwidth_bytes_per_s": bandwidth,
        "target_weight_bytes": weights,
        "rows": [],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    for mode in modes:
        with torch.inference_mode():
            for row in measure(pair, same, mode, work, args.device, limits):
                report["rows"].append(row)
                report["seconds"] = time.perf_counter() - started
                args.out.write_text(json.dumps(report, indent=2))  # kept as it comes: compiling is slow
    rows = report["rows"]
    print(
        f"{label}; {report['machine']}; bandwidth {bandwidth / 1e9:.1f} GB/s; "
        f"target weights {weights / 1e6:.1f} MB"
    )
    print(table(rows, modes))
    if args.plot:
        plot(rows, modes, args.plot)


if __name__ == "__main__":
    main()

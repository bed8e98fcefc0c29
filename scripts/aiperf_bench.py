"""NVIDIA AIPerf against the OpenAI-compatible front: chat, streaming, a few concurrencies;
then once against Triton's own /generate_stream with the TensorRT-LLM tensor names.

    python scripts/aiperf_bench.py --aiperf .venv-aiperf/bin/aiperf --out results/aiperf
    python scripts/aiperf_bench.py ... --url http://host:9000 [--triton-url http://host:8000]

Without --url it starts tritonserver (cpu config, tiny pair) and the front on free
loopback ports and stops both at the end. Per run, AIPerf's own CSV/JSON go to
OUT/<run>/; OUT/summary.json and OUT/summary.md hold the table: TTFT, inter-token
latency, output tokens/s, and (when this script started the server) the draft
acceptance rate the server measured during that run. On the OpenAI endpoint token
counts are the server's (`--use-server-token-count`): it reports exact usage, and
re-tokenizing the tiny model's random text does not give back the tokens it generated.
/generate_stream reports no usage, so that row counts tokens with the tokenizer.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specbatch.server.children import OpenAIFrontProcess  # noqa: E402
from specbatch.server.launcher import ensure_tiny_models  # noqa: E402
from specbatch.server.ports import Ports, free_port  # noqa: E402
from specbatch.server.process import ServerOptions, TritonProcess  # noqa: E402

# AIPerf's template endpoint speaking the ensemble's TensorRT-LLM names over /generate_stream.
TRITON_TEMPLATE = (
    '{"text_input": [{{ text|tojson }}], "max_tokens": {{ max_tokens }}, '
    '"stream": true, "exclude_input_in_output": true}'
)


@contextlib.contextmanager
def local_pipeline(out: Path, env: dict[str, str] | None = None) -> Iterator[tuple[str, str, str]]:
    """(front URL, Triton HTTP URL, metrics URL) of a server and front started here;
    ``env`` holds SPECBATCH_* overrides of the cpu config's parameters."""
    ensure_tiny_models(ROOT)
    options = ServerOptions(
        root=ROOT, config_name="cpu", ports=Ports.free(), host="127.0.0.1", exit_timeout_s=10, env=env or {}
    )
    server = TritonProcess(options)
    front = OpenAIFrontProcess(server.options.triton_grpc_url, free_port(), "127.0.0.1")
    try:
        server.start(out / "tritonserver.log")
        server.wait_ready()
        front.start(out / "openai_front.log")
        front.wait_ready()
        yield front.url, f"http://{server.http_url}", server.metrics_url
    finally:
        front.stop()
        server.stop()


def counters(metrics_url: str | None) -> tuple[float, float]:
    """(draft tokens, accepted draft tokens) the server has counted so far."""
    if metrics_url is None:
        return 0.0, 0.0
    with urllib.request.urlopen(metrics_url, timeout=10) as reply:
        text = reply.read().decode()

    def total(name: str) -> float:
        return sum(float(v) for v in re.findall(rf"^{name}\{{[^}}]*\}} (\S+)$", text, re.MULTILINE))

    return total("specbatch_draft_tokens_total"), total("specbatch_accepted_draft_tokens_total")


def run_aiperf(args: argparse.Namespace, endpoint: list[str], concurrency: int, out: Path) -> dict:
    command = [
        args.aiperf, "profile", "--model", "specbatch", *endpoint, "--streaming",
        "--concurrency", str(concurrency),
        "--request-count", str(args.requests), "--warmup-request-count", str(concurrency),
        "--synthetic-input-tokens-mean", str(args.isl), "--synthetic-input-tokens-stddev", "0",
        "--output-tokens-mean", str(args.osl), "--output-tokens-stddev", "0",
        "--tokenizer", str(args.tokenizer),
        "--random-seed", "0", "--artifact-dir", str(out), "--ui-type", "none", "--no-auto-plot",
    ]  # fmt: skip
    # A local tokenizer path needs no hub; HF_HUB_OFFLINE would make AIPerf look for a hub cache.
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    print("$", " ".join(command), flush=True)
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
    return json.loads((out / "profile_export_aiperf.json").read_text())


def openai_chat(url: str) -> list[str]:
    return ["--url", url, "--endpoint-type", "chat", "--use-server-token-count"]


def triton_generate_stream(url: str) -> list[str]:
    return [
        "--url", url, "--endpoint-type", "template",
        "--custom-endpoint", "/v2/models/specbatch/generate_stream",
        "--extra-inputs", json.dumps({"payload_template": TRITON_TEMPLATE, "response_field": "text_output"}),
    ]  # fmt: skip


def row(endpoint: str, concurrency: int, report: dict, drafted: float, accepted: float) -> dict:
    def stat(metric: str, key: str) -> float:
        return round(float(report[metric][key]), 2)

    return {
        "endpoint": endpoint,
        "concurrency": concurrency,
        "requests": int(report["request_count"]["avg"]),
        "requests_per_s": stat("request_throughput", "avg"),
        "ttft_ms_p50": stat("time_to_first_token", "p50"),
        "ttft_ms_p95": stat("time_to_first_token", "p95"),
        "itl_ms_p50": stat("inter_token_latency", "p50"),
        "itl_ms_p95": stat("inter_token_latency", "p95"),
        "output_tokens_per_s": stat("output_token_throughput", "avg"),
        "output_tokens_per_s_per_user": stat("output_token_throughput_per_user", "avg"),
        # the goodput policy drafts only where speculation pays: few drafts, a rough rate
        "draft_tokens": int(drafted),
        "acceptance_rate": round(accepted / drafted, 3) if drafted else None,
    }


def markdown(rows: list[dict]) -> str:
    lines = [
        "| endpoint | concurrency | requests/s | TTFT p50 / p95 (ms) | ITL p50 / p95 (ms) | "
        "output tokens/s | tokens/s per user | draft acceptance (of draft tokens) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        acceptance = (
            "none drafted"
            if r["acceptance_rate"] is None
            else f"{r['acceptance_rate']:.2f} (of {r['draft_tokens']:,})"
        )
        lines.append(
            f"| {r['endpoint']} | {r['concurrency']} | {r['requests_per_s']:.2f} | "
            f"{r['ttft_ms_p50']:.0f} / {r['ttft_ms_p95']:.0f} | "
            f"{r['itl_ms_p50']:.1f} / {r['itl_ms_p95']:.1f} | {r['output_tokens_per_s']:.1f} | "
            f"{r['output_tokens_per_s_per_user']:.1f} | {acceptance} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--aiperf", default=str(ROOT / ".venv-aiperf" / "bin" / "aiperf"))
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "aiperf")
    parser.add_argument("--url", help="a running OpenAI front (default: start server and front here)")
    parser.add_argument(
        "--triton-url", help="with --url: the server's HTTP endpoint for the /generate_stream run"
    )
    parser.add_argument("--tokenizer", type=Path, default=ROOT / ".models" / "tiny" / "target")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--requests", type=int, default=24, help="measured requests per concurrency")
    parser.add_argument("--isl", type=int, default=128, help="synthetic input tokens per request")
    parser.add_argument("--osl", type=int, default=64, help="output tokens asked per request")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        if args.url:
            url, triton_url, metrics_url = args.url, args.triton_url, None
        else:
            url, triton_url, metrics_url = stack.enter_context(local_pipeline(args.out))
        runs = [("OpenAI chat", c, openai_chat(url), f"c{c}") for c in args.concurrency]
        if triton_url:
            runs.append(("Triton generate_stream", 2, triton_generate_stream(triton_url), "triton_c2"))
        rows = []
        for name, concurrency, endpoint, directory in runs:
            before = counters(metrics_url)
            report = run_aiperf(args, endpoint, concurrency, args.out / directory)
            drafted, accepted = (b - a for a, b in zip(before, counters(metrics_url), strict=True))
            rows.append(row(name, concurrency, report, drafted, accepted))
    (args.out / "summary.json").write_text(json.dumps(rows, indent=2) + "\n")
    table = markdown(rows)
    (args.out / "summary.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()

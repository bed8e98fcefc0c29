"""The CI smoke load test: the smoke profile through the runner against the session's server."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specbatch.loadtest.profiles import load_profile

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "loadtest" / "profiles" / "smoke.yaml"

# Four greenlets, each with its own stream, as Locust runs its users; prints every request's interval.
GEVENT_STREAMS = """
from gevent import monkey
monkey.patch_all()
import json, sys
import gevent
from specbatch.loadtest.grpc_stream import StreamingGenerateClient, enable_grpc_under_gevent
enable_grpc_under_gevent()

def user(number):
    client = StreamingGenerateClient(sys.argv[1], timeout_s=60)
    done = []
    for k in range(2):
        prompt = f"Instruction: Write a poem about {number * 2 + k}.\\nQuestion: \\nGeneration:"
        generation = client.generate(prompt, max_tokens=16)
        done.append([generation.start, generation.end, generation.finish_reason])
    client.close()
    return done

greenlets = [gevent.spawn(user, number) for number in range(4)]
gevent.joinall(greenlets, raise_error=True)
print(json.dumps([interval for g in greenlets for interval in g.value]))
"""


def test_smoke_profile_meets_its_sla_and_leaves_csv_html_and_png(server, tmp_path):
    profile = load_profile(SMOKE)
    out = tmp_path / "smoke"
    command = [
        sys.executable, "-m", "specbatch.loadtest", "--profile", str(SMOKE), "--out", str(out),
        "--host", server.http_url, "--grpc-host", server.grpc_url,
    ]  # fmt: skip
    env = dict(os.environ, HF_HUB_OFFLINE="1")

    completed = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=profile.workload.duration_s + 60
    )

    assert completed.returncode == 0, f"{completed.stdout}\n{completed.stderr}"
    assert f"SLA PASS for profile {profile.name}" in completed.stdout
    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["passed"] is True
    assert verdict["failures"] == 0
    for name in ("locust_stats.csv", "locust_stats_history.csv", "report.html", "latency.png"):
        assert (out / name).stat().st_size > 0, name
    assert (out / "latency.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with open(out / "locust_stats.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    counts = {(row["Type"], row["Name"]): int(row["Request Count"]) for row in rows}
    sizes = {(row["Type"], row["Name"]): float(row["Average Content Size"]) for row in rows}
    # ignore_eos: every infobench answer, over either client, ran its max_tokens
    assert sizes[("gRPC E2E", "infobench")] == sizes[("HTTP E2E", "infobench")] == 24
    for task in ("graph", "mmlu", "infobench"):
        assert counts[("gRPC E2E", task)] > 0
        assert counts[("HTTP E2E", task)] > 0
        assert counts[("TTFT", task)] == counts[("gRPC E2E", task)]
    assert counts[("TPOT", "infobench")] > 0


def test_grpc_stream_clients_run_concurrently_under_gevent(server):
    completed = subprocess.run(
        [sys.executable, "-c", GEVENT_STREAMS, server.grpc_url],
        cwd=ROOT,
        env=dict(os.environ, HF_HUB_OFFLINE="1"),
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert completed.returncode == 0, completed.stderr
    intervals = json.loads(completed.stdout.splitlines()[-1])
    assert len(intervals) == 8
    assert {reason for _, _, reason in intervals} <= {"stop", "length"}
    # A request of one greenlet was sent while another's was still in flight: the
    # gRPC stream did not block the gevent hub.
    most_in_flight = max(sum(1 for s, e, _ in intervals if s <= start < e) for start, _, _ in intervals)
    assert most_in_flight >= 2

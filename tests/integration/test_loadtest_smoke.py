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
        counts = {(row["Type"], row["Name"]): int(row["Request Count"]) for row in csv.DictReader(handle)}
    for task in ("graph", "mmlu", "infobench"):
        assert counts[("gRPC E2E", task)] > 0
        assert counts[("HTTP E2E", task)] > 0
        assert counts[("TTFT", task)] == counts[("gRPC E2E", task)]
    assert counts[("TPOT", "infobench")] > 0

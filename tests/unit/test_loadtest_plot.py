"""The latency-over-time reader and PNG, on a stats history written in Locust's layout."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from specbatch.loadtest.plot import plot_latency_over_time, read_history
from specbatch.loadtest.sla import StatsFileError

PERCENTILES = ("50%", "66%", "75%", "80%", "90%", "95%", "98%", "99%", "99.9%", "99.99%", "100%")
COLUMNS = (
    "Timestamp", "User Count", "Type", "Name", "Requests/s", "Failures/s", *PERCENTILES,
    "Total Request Count", "Total Failure Count", "Total Median Response Time", "Total Average Response Time",
    "Total Min Response Time", "Total Max Response Time", "Total Average Content Size",
)  # fmt: skip


def history_row(second: int, users: int, kind: str, name: str, rps: float, p50: object, p95: object) -> list:
    percentiles = [p50, 0, 0, 0, 0, p95, 0, 0, 0, 0, 0]
    return [1700000100 + second, users, kind, name, rps, 0, *percentiles, 1, 0, 1, 1, 1, 1, 1]


@pytest.fixture
def history(tmp_path: Path) -> Path:
    path = tmp_path / "locust_stats_history.csv"
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(COLUMNS)
        writer.writerows(
            [
                history_row(0, 0, "", "Aggregated", 0, "N/A", "N/A"),
                history_row(1, 3, "TTFT", "mmlu", 2.0, 0, 0),
                history_row(1, 3, "gRPC E2E", "mmlu", 2.0, 0, 0),
                history_row(1, 3, "HTTP E2E", "mmlu", 1.0, 0, 0),
                history_row(2, 3, "TTFT", "mmlu", 3.0, 120, 300),
                history_row(2, 3, "gRPC E2E", "mmlu", 3.0, 150, 380),
                history_row(2, 3, "HTTP E2E", "mmlu", 0.5, 160, 400),
                history_row(2, 3, "", "Aggregated", 6.5, 150, 390),
            ]
        )
    return path


def test_history_gives_percentiles_per_series_and_e2e_rate_per_second(history):
    series, load = read_history(history)

    assert series[("TTFT", "mmlu")] == [(1.0, None, None), (2.0, 120.0, 300.0)]
    assert series[("HTTP E2E", "mmlu")] == [(1.0, None, None), (2.0, 160.0, 400.0)]
    assert ("", "Aggregated") not in series
    assert load == [(0.0, 0.0, 0), (1.0, 3.0, 3), (2.0, 3.5, 3)]


def test_plot_is_written_as_png(history, tmp_path):
    out = plot_latency_over_time(history, tmp_path / "plots" / "latency.png")

    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_file_that_is_not_a_history_is_refused(tmp_path):
    path = tmp_path / "other.csv"
    path.write_text("a,b\n1,2\n")

    with pytest.raises(StatsFileError, match="not a Locust stats history"):
        read_history(path)

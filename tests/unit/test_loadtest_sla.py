"""SLA verdicts on Locust statistics files written here in Locust's own CSV layout."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml
from test_loadtest_plot import COLUMNS as HISTORY_COLUMNS
from test_loadtest_plot import PERCENTILES, history_row

from specbatch.loadtest.profiles import load_profile
from specbatch.loadtest.runner import EXIT_BREACH, EXIT_PASS, EXIT_RUN_FAILED, EXIT_USAGE, main
from specbatch.loadtest.sla import StatsFileError, evaluate, read_stats_csv, verdict_table

STATS_COLUMNS = (
    "Type", "Name", "Request Count", "Failure Count", "Median Response Time", "Average Response Time",
    "Min Response Time", "Max Response Time", "Average Content Size", "Requests/s", "Failures/s",
    *PERCENTILES,
)  # fmt: skip

PROFILE = {
    "name": "unit",
    "workload": {
        "users": 2,
        "duration": "10s",
        "clients": {"grpc_stream": 1, "http": 1},
        "mix": {"graph": 1, "infobench": 1},
        "prompts": {"source": "generated", "count": 3},
        "arrival": {"shape": "constant", "rate": 1},
    },
    "sla": {
        "max_error_rate": 0.1,
        "tasks": {
            "graph": {"e2e_p99_ms": 50},
            "infobench": {"ttft_p95_ms": 300, "tpot_p95_ms": 20, "e2e_p99_ms": 1000},
        },
    },
}


def stats_row(kind: str, name: str, requests: int, p95: float, p99: float, failures: int = 0) -> list:
    values = {"95%": p95, "99%": p99, "50%": p95 / 2}
    percentiles = [values.get(column, p99) for column in PERCENTILES]
    return [
        kind,
        name,
        requests,
        failures,
        p95 / 2,
        p95 / 2,
        1,
        p99,
        10,
        requests / 10,
        failures / 10,
        *percentiles,
    ]


PASSING = [
    stats_row("TTFT", "infobench", 40, 250, 290),
    stats_row("TPOT", "infobench", 40, 15, 19),
    stats_row("gRPC E2E", "infobench", 40, 700, 900),
    stats_row("HTTP E2E", "infobench", 10, 800, 950),
    stats_row("TTFT", "graph", 30, 3, 4),
    stats_row("gRPC E2E", "graph", 30, 3, 4),
    stats_row("HTTP E2E", "graph", 10, 5, 6),
]


def write_stats(directory: Path, rows: list[list]) -> Path:
    path = directory / "locust_stats.csv"
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(STATS_COLUMNS)
        writer.writerows(rows)
        total = sum(row[2] for row in rows)
        writer.writerow(["", "Aggregated", total, 0, 1, 1, 1, 1, 1, 1, 0, *["N/A"] * len(PERCENTILES)])
    return path


def write_profile(directory: Path, document: dict = PROFILE) -> Path:
    path = directory / "profile.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def results(verdict) -> dict[tuple[str, str], str]:
    return {(check.task, check.metric): check.result for check in verdict.checks}


def test_stats_rows_are_read_without_the_aggregated_row(tmp_path):
    rows = read_stats_csv(write_stats(tmp_path, PASSING))

    assert len(rows) == len(PASSING)
    ttft = rows[0]
    assert (ttft.request_type, ttft.name, ttft.requests, ttft.failures) == ("TTFT", "infobench", 40, 0)
    assert ttft.percentiles["95%"] == 250.0
    assert ttft.percentiles["99%"] == 290.0


def test_all_targets_met_passes_with_every_check_listed(tmp_path):
    profile = load_profile(write_profile(tmp_path))

    verdict = evaluate(read_stats_csv(write_stats(tmp_path, PASSING)), profile)

    assert verdict.passed and verdict.exit_code == 0
    assert results(verdict) == {
        ("graph", "p99 e2e (gRPC)"): "pass",
        ("graph", "p99 e2e (HTTP)"): "pass",
        ("graph", "error rate"): "pass",
        ("infobench", "p95 TTFT"): "pass",
        ("infobench", "p95 TPOT"): "pass",
        ("infobench", "p99 e2e (gRPC)"): "pass",
        ("infobench", "p99 e2e (HTTP)"): "pass",
        ("infobench", "error rate"): "pass",
        ("all", "error rate"): "pass",
    }
    assert verdict.requests == 90
    assert verdict.throughput_rps == pytest.approx(9.0)


def test_a_latency_over_its_target_is_a_breach(tmp_path):
    rows = [*PASSING]
    rows[0] = stats_row("TTFT", "infobench", 40, 301, 400)
    profile = load_profile(write_profile(tmp_path))

    verdict = evaluate(read_stats_csv(write_stats(tmp_path, rows)), profile)

    assert not verdict.passed and verdict.exit_code == 1
    breaches = [(c.task, c.metric, c.observed) for c in verdict.checks if not c.passed]
    assert breaches == [("infobench", "p95 TTFT", 301.0)]


def test_a_target_met_exactly_passes(tmp_path):
    rows = [*PASSING]
    rows[5] = stats_row("gRPC E2E", "graph", 30, 40, 50)

    verdict = evaluate(read_stats_csv(write_stats(tmp_path, rows)), load_profile(write_profile(tmp_path)))

    assert verdict.passed


def test_error_rate_counts_failures_of_both_protocols(tmp_path):
    rows = [*PASSING]
    rows[2] = stats_row("gRPC E2E", "infobench", 40, 700, 900, failures=4)
    rows[3] = stats_row("HTTP E2E", "infobench", 10, 800, 950, failures=2)

    verdict = evaluate(read_stats_csv(write_stats(tmp_path, rows)), load_profile(write_profile(tmp_path)))

    errors = {c.task: c for c in verdict.checks if c.metric == "error rate"}
    assert errors["infobench"].observed == pytest.approx(6 / 50)
    assert errors["infobench"].result == "BREACH"
    assert errors["graph"].observed == 0.0
    assert errors["all"].observed == pytest.approx(6 / 90)
    assert errors["all"].result == "pass"
    assert verdict.failures == 6


def test_a_checked_figure_without_samples_is_no_data_and_fails(tmp_path):
    rows = [row for row in PASSING if not (row[0] == "HTTP E2E" and row[1] == "graph")]
    rows = [row for row in rows if row[0] != "TPOT"]

    verdict = evaluate(read_stats_csv(write_stats(tmp_path, rows)), load_profile(write_profile(tmp_path)))

    assert not verdict.passed
    assert results(verdict)[("graph", "p99 e2e (HTTP)")] == "NO DATA"
    assert results(verdict)[("infobench", "p95 TPOT")] == "NO DATA"


def test_a_row_of_failures_only_is_no_data_not_a_fast_pass(tmp_path):
    rows = [*PASSING]
    rows[6] = stats_row("HTTP E2E", "graph", 10, 1, 1, failures=10)

    verdict = evaluate(read_stats_csv(write_stats(tmp_path, rows)), load_profile(write_profile(tmp_path)))

    assert results(verdict)[("graph", "p99 e2e (HTTP)")] == "NO DATA"
    assert results(verdict)[("graph", "error rate")] == "BREACH"


def test_a_run_without_requests_fails(tmp_path):
    verdict = evaluate(read_stats_csv(write_stats(tmp_path, [])), load_profile(write_profile(tmp_path)))

    assert not verdict.passed
    assert all(check.result == "NO DATA" for check in verdict.checks)


def test_protocols_the_profile_does_not_run_are_not_checked(tmp_path):
    document = yaml.safe_load(yaml.safe_dump(PROFILE))
    document["workload"]["clients"] = {"grpc_stream": 2}
    rows = [row for row in PASSING if row[0] != "HTTP E2E"]

    verdict = evaluate(
        read_stats_csv(write_stats(tmp_path, rows)), load_profile(write_profile(tmp_path, document))
    )

    assert verdict.passed
    assert not any("HTTP" in check.metric for check in verdict.checks)


def test_verdict_table_lists_every_check_and_the_outcome(tmp_path):
    rows = [*PASSING]
    rows[1] = stats_row("TPOT", "infobench", 40, 21, 30)
    verdict = evaluate(read_stats_csv(write_stats(tmp_path, rows)), load_profile(write_profile(tmp_path)))

    lines = verdict_table(verdict).splitlines()

    assert lines[0].split() == ["task", "metric", "target", "observed", "samples", "result"]
    assert len(lines) == 2 + len(verdict.checks) + 1
    assert lines[2 + 4].split() == ["infobench", "p95", "TPOT", "20", "ms", "21", "ms", "40", "BREACH"]
    assert lines[-1] == "SLA FAIL for profile unit: 90 requests, 0 failed, 9.00 requests/s"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("Type,Name\nTTFT,graph\n", "no column"),
        (",".join(STATS_COLUMNS) + "\nTTFT,graph,many\n", ":2: not a"),
    ],
)
def test_files_that_are_not_locust_stats_are_refused(tmp_path, content, message):
    path = tmp_path / "locust_stats.csv"
    path.write_text(content)

    with pytest.raises(StatsFileError, match=message):
        read_stats_csv(path)


def write_history(directory: Path) -> None:
    with open(directory / "locust_stats_history.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(HISTORY_COLUMNS)
        for second in range(5):
            writer.writerow(history_row(second, 2, "TTFT", "infobench", 1.5, 100, 200))
            writer.writerow(history_row(second, 2, "gRPC E2E", "infobench", 1.5, 300, 600))


def run_judge(directory: Path, profile: Path) -> int:
    return main(["--profile", str(profile), "--out", str(directory), "--judge-only"])


def test_judge_exits_zero_on_pass_and_writes_verdict_and_plot(tmp_path, capsys):
    write_stats(tmp_path, PASSING)
    write_history(tmp_path)

    code = run_judge(tmp_path, write_profile(tmp_path))

    assert code == EXIT_PASS == 0
    assert "SLA PASS for profile unit" in capsys.readouterr().out
    verdict = json.loads((tmp_path / "verdict.json").read_text())
    assert verdict["passed"] is True
    assert len(verdict["checks"]) == 9
    assert (tmp_path / "latency.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_judge_exits_one_on_breach(tmp_path, capsys):
    rows = [*PASSING]
    rows[6] = stats_row("HTTP E2E", "graph", 10, 60, 70)
    write_stats(tmp_path, rows)

    code = run_judge(tmp_path, write_profile(tmp_path))

    assert code == EXIT_BREACH == 1
    assert "BREACH" in capsys.readouterr().out
    assert json.loads((tmp_path / "verdict.json").read_text())["passed"] is False


def test_bad_profile_exits_two_with_the_field_named(tmp_path, capsys):
    document = yaml.safe_load(yaml.safe_dump(PROFILE))
    document["sla"]["max_error_rate"] = 2

    code = run_judge(tmp_path, write_profile(tmp_path, document))

    assert code == EXIT_USAGE == 2
    assert "sla.max_error_rate is a fraction" in capsys.readouterr().err


def test_missing_statistics_exit_three(tmp_path, capsys):
    code = run_judge(tmp_path, write_profile(tmp_path))

    assert code == EXIT_RUN_FAILED == 3
    assert "cannot read Locust statistics" in capsys.readouterr().err


def test_hosts_must_cover_the_profiles_clients(tmp_path, capsys):
    code = main(["--profile", str(write_profile(tmp_path)), "--out", str(tmp_path), "--grpc-host", "h:1"])

    assert code == EXIT_USAGE
    assert "give --host with --grpc-host" in capsys.readouterr().err

"""The SLA verdict: Locust's per-task statistics against a profile's targets.

Reads Locust's `<prefix>_stats.csv` (whole-run percentiles per request type and name,
as `specbatch.loadtest.users` records them) and checks, per task: p95 TTFT, p95 TPOT,
p99 end-to-end on each protocol that ran, and the error rate of its end-to-end
requests; plus the error rate over all requests. A target whose figure has no samples
is a breach: a run that measured nothing has not met anything.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from specbatch.loadtest.profiles import LoadProfile

TTFT, TPOT, GRPC_E2E, HTTP_E2E = "TTFT", "TPOT", "gRPC E2E", "HTTP E2E"
E2E_TYPES = (GRPC_E2E, HTTP_E2E)
CLIENT_E2E_TYPE = {"grpc_stream": GRPC_E2E, "http": HTTP_E2E}
ALL_TASKS = "all"


class StatsFileError(ValueError):
    """The Locust statistics file is missing or not in Locust's CSV format."""


@dataclass(frozen=True)
class StatsRow:
    """One row of Locust's stats CSV; percentiles in milliseconds keyed by their column ("95%")."""

    request_type: str
    name: str
    requests: int
    failures: int
    requests_per_s: float
    percentiles: dict[str, float]


@dataclass(frozen=True)
class Check:
    task: str
    metric: str
    target: float
    observed: float | None
    samples: int
    unit: str

    @property
    def passed(self) -> bool:
        return self.observed is not None and self.observed <= self.target

    @property
    def result(self) -> str:
        if self.observed is None:
            return "NO DATA"
        return "pass" if self.passed else "BREACH"


@dataclass(frozen=True)
class Verdict:
    profile: str
    checks: list[Check]
    requests: int
    failures: int
    throughput_rps: float

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(check.passed for check in self.checks)

    @property
    def exit_code(self) -> int:
        """0 when every target holds, 1 on any breach (what the runner exits with)."""
        return 0 if self.passed else 1


def _stats_row(record: dict[str, str]) -> StatsRow:
    percentiles = {
        key: float(value)
        for key, value in record.items()
        if key and key.endswith("%") and value not in ("", "N/A")
    }
    return StatsRow(
        request_type=record["Type"],
        name=record["Name"],
        requests=int(record["Request Count"]),
        failures=int(record["Failure Count"]),
        requests_per_s=float(record["Requests/s"]),
        percentiles=percentiles,
    )


def read_stats_csv(path: Path) -> list[StatsRow]:
    """Rows of Locust's `_stats.csv`, without the Aggregated row."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise StatsFileError(f"cannot read Locust statistics {path}: {exc.strerror or exc}") from None
    reader = csv.DictReader(io.StringIO(text))
    needed = {"Type", "Name", "Request Count", "Failure Count", "Requests/s", "95%", "99%"}
    missing = needed - set(reader.fieldnames or ())
    if missing:
        raise StatsFileError(f"{path} is not a Locust stats CSV: no column(s) {', '.join(sorted(missing))}")
    rows = []
    for line, record in enumerate(reader, start=2):
        if record["Name"] == "Aggregated" and not record["Type"]:
            continue
        try:
            rows.append(_stats_row(record))
        except (TypeError, ValueError) as exc:
            raise StatsFileError(f"{path}:{line}: not a Locust statistics row ({exc})") from None
    return rows


def _latency_check(
    rows: dict[tuple[str, str], StatsRow],
    request_type: str,
    task: str,
    percentile: str,
    target: float,
    metric: str,
) -> Check:
    """A percentile against its target; samples are the successful requests.

    Locust's percentiles include the times of failed requests, which the error-rate check
    judges; a row of failures only is no data, so fast refusals cannot pass a latency target.
    """
    row = rows.get((request_type, task))
    samples = row.requests - row.failures if row else 0
    observed = row.percentiles.get(percentile) if row and samples > 0 else None
    return Check(task=task, metric=metric, target=target, observed=observed, samples=samples, unit="ms")


def _error_check(task: str, requests: int, failures: int, max_error_rate: float) -> Check:
    observed = failures / requests if requests else None
    return Check(
        task=task,
        metric="error rate",
        target=max_error_rate,
        observed=observed,
        samples=requests,
        unit="ratio",
    )


def evaluate(rows: list[StatsRow], profile: LoadProfile) -> Verdict:
    """Every check the profile's SLA asks for, in task order; see the module docstring for the rules."""
    by_key = {(row.request_type, row.name): row for row in rows}
    e2e_types = [CLIENT_E2E_TYPE[client] for client in profile.workload.active_clients]
    checks: list[Check] = []
    for task in profile.workload.active_tasks:
        targets = profile.sla.tasks.get(task)
        if targets is not None and targets.ttft_p95_ms is not None:
            checks.append(_latency_check(by_key, TTFT, task, "95%", targets.ttft_p95_ms, "p95 TTFT"))
        if targets is not None and targets.tpot_p95_ms is not None:
            checks.append(_latency_check(by_key, TPOT, task, "95%", targets.tpot_p95_ms, "p95 TPOT"))
        if targets is not None and targets.e2e_p99_ms is not None:
            for request_type in e2e_types:
                metric = f"p99 e2e ({request_type.split()[0]})"
                checks.append(_latency_check(by_key, request_type, task, "99%", targets.e2e_p99_ms, metric))
        task_rows = [by_key[(t, task)] for t in E2E_TYPES if (t, task) in by_key]
        checks.append(
            _error_check(
                task,
                sum(r.requests for r in task_rows),
                sum(r.failures for r in task_rows),
                profile.sla.max_error_rate,
            )
        )
    e2e_rows = [row for row in rows if row.request_type in E2E_TYPES]
    requests = sum(row.requests for row in e2e_rows)
    failures = sum(row.failures for row in e2e_rows)
    checks.append(_error_check(ALL_TASKS, requests, failures, profile.sla.max_error_rate))
    return Verdict(
        profile=profile.name,
        checks=checks,
        requests=requests,
        failures=failures,
        throughput_rps=sum(row.requests_per_s for row in e2e_rows),
    )


def _format(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    return f"{value:.1%}" if unit == "ratio" else f"{value:.0f} ms"


def verdict_table(verdict: Verdict) -> str:
    """A plain-text table: task, metric, target, observed, samples, result; then the overall line."""
    header = ("task", "metric", "target", "observed", "samples", "result")
    lines = [header] + [
        (c.task, c.metric, _format(c.target, c.unit), _format(c.observed, c.unit), str(c.samples), c.result)
        for c in verdict.checks
    ]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    rendered = [
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in lines
    ]
    rendered.insert(1, "  ".join("-" * width for width in widths))
    outcome = "PASS" if verdict.passed else "FAIL"
    rendered.append(
        f"SLA {outcome} for profile {verdict.profile}: {verdict.requests} requests, "
        f"{verdict.failures} failed, {verdict.throughput_rps:.2f} requests/s"
    )
    return "\n".join(rendered)


def write_verdict_json(verdict: Verdict, path: Path) -> None:
    """The verdict as JSON, for CI artefacts and scripts."""
    document = {
        "profile": verdict.profile,
        "passed": verdict.passed,
        "requests": verdict.requests,
        "failures": verdict.failures,
        "throughput_rps": verdict.throughput_rps,
        "checks": [
            {**asdict(check), "passed": check.passed, "result": check.result} for check in verdict.checks
        ],
    }
    path.write_text(json.dumps(document, indent=2) + "\n")

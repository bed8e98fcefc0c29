"""`python -m specbatch.loadtest`: one headless Locust run against an SLA, start to verdict.

Stages: read the profile; start a server (the cpu config on free loopback ports, tiny
models built if absent) unless --host/--grpc-host name one; run Locust headless as a
subprocess with the profile in $SPECBATCH_LOADTEST_PROFILE; evaluate the SLA from its
CSV; print the verdict table; write verdict.json and the latency PNG; stop the server.

Exit codes: 0 every target met, 1 an SLA breach, 2 a bad profile or bad arguments,
3 the run itself failed (the server did not start, Locust crashed or wrote no CSV).
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from specbatch.loadtest.grpc_stream import GRPC_HOST_ENV
from specbatch.loadtest.plot import plot_latency_over_time
from specbatch.loadtest.profiles import PROFILE_ENV, LoadProfile, ProfileError, load_profile
from specbatch.loadtest.prompts import build_prompt_pool
from specbatch.loadtest.sla import StatsFileError, evaluate, read_stats_csv, verdict_table, write_verdict_json

EXIT_PASS, EXIT_BREACH, EXIT_USAGE, EXIT_RUN_FAILED = 0, 1, 2, 3
CSV_PREFIX = "locust"
LOCUSTFILE = Path("loadtest") / "locustfile.py"
SERVER_START_TIMEOUT_S = 300.0

logger = logging.getLogger(__name__)


class RunFailed(RuntimeError):
    """The load test could not produce statistics to judge."""


@dataclass(frozen=True)
class Endpoints:
    """`host:port` of the HTTP and gRPC front ends; None for one the profile does not use."""

    http: str | None
    grpc: str | None


@dataclass(frozen=True)
class RunOutputs:
    """Where a run leaves its files, all under one directory."""

    out: Path

    @property
    def csv_prefix(self) -> Path:
        return self.out / CSV_PREFIX

    @property
    def stats_csv(self) -> Path:
        return self.out / f"{CSV_PREFIX}_stats.csv"

    @property
    def history_csv(self) -> Path:
        return self.out / f"{CSV_PREFIX}_stats_history.csv"

    @property
    def html(self) -> Path:
        return self.out / "report.html"

    @property
    def png(self) -> Path:
        return self.out / "latency.png"

    @property
    def verdict_json(self) -> Path:
        return self.out / "verdict.json"

    @property
    def server_log(self) -> Path:
        return self.out / "server.log"

    @property
    def locust_log(self) -> Path:
        return self.out / "locust.log"


def _strip_scheme(host: str) -> str:
    return host.split("://", 1)[-1].rstrip("/")


def required_endpoints(profile: LoadProfile, http: str | None, grpc: str | None) -> Endpoints:
    """The given endpoints, checked against the clients the profile runs; ProfileError if one is missing."""
    clients = profile.workload.active_clients
    if "http" in clients and grpc and not http:
        raise ProfileError("the profile runs HTTP users: give --host with --grpc-host, or neither")
    if "grpc_stream" in clients and http and not grpc:
        raise ProfileError("the profile runs gRPC stream users: give --grpc-host with --host, or neither")
    return Endpoints(
        http=_strip_scheme(http) if http and "http" in clients else None,
        grpc=_strip_scheme(grpc) if grpc and "grpc_stream" in clients else None,
    )


@contextmanager
def local_server(log_path: Path) -> Iterator[Endpoints]:
    """A cpu-config tritonserver on free loopback ports, stopped by pid on exit."""
    from specbatch.server.launcher import ensure_tiny_models, project_root
    from specbatch.server.ports import Ports
    from specbatch.server.process import ServerOptions, ServerStartError, TritonProcess

    root = project_root()
    ensure_tiny_models(root)
    process = TritonProcess(
        ServerOptions(root=root, config_name="cpu", ports=Ports.free(), host="127.0.0.1", exit_timeout_s=10)
    )
    logger.info("starting tritonserver (cpu config); log: %s", log_path)
    process.start(log_path)
    try:
        try:
            process.wait_ready(timeout_s=SERVER_START_TIMEOUT_S)
        except ServerStartError as exc:
            raise RunFailed(str(exc)) from None
        logger.info("tritonserver ready: HTTP %s, gRPC %s", process.http_url, process.grpc_url)
        yield Endpoints(http=process.http_url, grpc=process.grpc_url)
    finally:
        logger.info("stopping tritonserver (pid %s)", process.process.pid if process.process else "-")
        process.stop()


def locust_command(
    profile: LoadProfile, endpoints: Endpoints, outputs: RunOutputs, locustfile: Path
) -> list[str]:
    """The headless Locust command line for the profile."""
    workload = profile.workload
    command = [
        sys.executable,
        "-m",
        "locust",
        "-f",
        str(locustfile),
        "--headless",
        "--users",
        str(workload.users),
        "--spawn-rate",
        f"{workload.spawn_rate:g}",
        "--run-time",
        f"{math.ceil(workload.duration_s)}s",
        "--stop-timeout",
        f"{math.ceil(workload.stop_timeout_s)}s",
        "--csv",
        str(outputs.csv_prefix),
        "--csv-full-history",
        "--html",
        str(outputs.html),
        "--exit-code-on-error",
        "0",
        "--only-summary",
        "--loglevel",
        "WARNING",
    ]
    if endpoints.http:
        command += ["--host", f"http://{endpoints.http}"]
    return command


def run_locust(profile: LoadProfile, endpoints: Endpoints, outputs: RunOutputs, root: Path) -> None:
    """Run Locust to completion; its console output and end-of-run summary go to locust.log."""
    env = dict(os.environ, **{PROFILE_ENV: str(profile.path.resolve())})
    env.setdefault("HF_HUB_OFFLINE", "1")
    if endpoints.grpc:
        env[GRPC_HOST_ENV] = endpoints.grpc
    command = locust_command(profile, endpoints, outputs, root / LOCUSTFILE)
    budget_s = profile.workload.duration_s + profile.workload.stop_timeout_s + 120
    logger.info(
        "running Locust for %.0fs: %d users, %s arrivals",
        profile.workload.duration_s,
        profile.workload.users,
        profile.workload.arrival.shape,
    )
    with open(outputs.locust_log, "wb") as log:
        try:
            completed = subprocess.run(
                command,
                env=env,
                cwd=root,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=budget_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise RunFailed(
                f"Locust did not finish within {budget_s:.0f}s; see {outputs.locust_log}"
            ) from None
    if completed.returncode != 0 or not outputs.stats_csv.exists():
        tail = "\n".join(outputs.locust_log.read_text(errors="replace").splitlines()[-30:])
        raise RunFailed(f"Locust exited with {completed.returncode}; see {outputs.locust_log}\n{tail}")


def judge(profile: LoadProfile, outputs: RunOutputs) -> int:
    """Evaluate the SLA from the run's CSV, print the verdict table, write verdict.json and the PNG."""
    verdict = evaluate(read_stats_csv(outputs.stats_csv), profile)
    print(verdict_table(verdict), flush=True)
    write_verdict_json(verdict, outputs.verdict_json)
    if outputs.history_csv.exists():
        plot_latency_over_time(outputs.history_csv, outputs.png, profile)
    logger.info("wrote %s, %s, %s and %s", outputs.stats_csv, outputs.html, outputs.png, outputs.verdict_json)
    return verdict.exit_code


def run(profile: LoadProfile, outputs: RunOutputs, http: str | None = None, grpc: str | None = None) -> int:
    """The whole run; returns the exit code (see the module docstring)."""
    from specbatch.server.launcher import project_root

    given = required_endpoints(profile, http, grpc)
    # A prompt source that lacks a task the mix sends fails here, before a server starts.
    build_prompt_pool(profile.workload)
    outputs.out.mkdir(parents=True, exist_ok=True)
    root = project_root()
    if given.http or given.grpc:
        run_locust(profile, given, outputs, root)
    else:
        with local_server(outputs.server_log) as endpoints:
            run_locust(profile, endpoints, outputs, root)
    return judge(profile, outputs)


def parse_arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m specbatch.loadtest",
        description="Run a Locust load test from a profile and judge it against the profile's SLA.",
    )
    parser.add_argument(
        "--profile", required=True, type=Path, help="workload + SLA YAML, e.g. loadtest/profiles/smoke.yaml"
    )
    parser.add_argument(
        "--out", required=True, type=Path, help="directory for CSV, HTML, PNG and verdict.json"
    )
    parser.add_argument("--host", help="HTTP front end HOST:PORT of a running server (default: start one)")
    parser.add_argument(
        "--grpc-host", help="gRPC front end HOST:PORT of a running server (default: start one)"
    )
    parser.add_argument(
        "--judge-only", action="store_true", help="re-evaluate the CSV already in --out, run nothing"
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    arguments = parse_arguments(argv)
    try:
        profile = load_profile(arguments.profile)
        outputs = RunOutputs(arguments.out)
        if arguments.judge_only:
            return judge(profile, outputs)
        return run(profile, outputs, arguments.host, arguments.grpc_host)
    except ProfileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (RunFailed, StatsFileError) as exc:
        print(f"load test failed: {exc}", file=sys.stderr)
        return EXIT_RUN_FAILED

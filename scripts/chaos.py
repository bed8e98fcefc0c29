"""`make chaos`: kill each kind of process of the pipeline under load, and record what the
clients saw.

For each launcher — `specbatch serve` (its supervisor brings stubs back, it restarts a
dead gateway or OpenAI front) and plain tritonserver as each pod of deploy/ runs it (in
the Kubernetes pod the gateway with `--supervise` brings stubs back, in the KServe pod
`specbatch watch` in tritonserver's container; a container that exits is started again,
as the kubelet does) — on loopback, with the tiny pair:

1. capacity: the mixed workload (loadtest/profiles/mixed.yaml) over HTTP `/generate`
   through the gateway, offered well past what the server completes; the answers per
   second it completes are 100 %;
2. for each fault in turn, Poisson arrivals at ``--load`` of that capacity for
   ``--window`` seconds, the fault injected ``--before`` seconds in: ``kill -9`` of a
   decoding instance, the scheduler, the router, the OpenAI front, the gateway, SIGSTOP
   of a decoding instance (a hang, found after SPECBATCH_INSTANCE_HANG_MS, 5 s here),
   and ``kill -9`` of tritonserver itself. A tenth of the requests go through the OpenAI
   front instead.

Per fault: requests sent, answered ok, answered with an error (by HTTP status, or
"connection" when the process holding the connection died), never answered (the
client's own 60 s timeout); and, in seconds after the fault: ready again (from when
`/v2/health/ready` stays 200; 0 if it never dropped), serving again (the first request
sent after the fault answered ok), full capacity again (ready, and both decoding
instances in service). Writes JSON, a markdown table and a plot; exits 1 if any
request was never answered.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specbatch.figures import save_figure  # noqa: E402
from specbatch.lifeline import exit_with_parent_preexec  # noqa: E402
from specbatch.loadtest.capacity import Probe, describe, probe_until_overloaded  # noqa: E402
from specbatch.loadtest.profiles import load_profile  # noqa: E402
from specbatch.loadtest.prompts import PromptPool, build_prompt_pool  # noqa: E402
from specbatch.server.children import OpenAIFrontProcess  # noqa: E402
from specbatch.server.launcher import ensure_tiny_models, keep_running  # noqa: E402
from specbatch.server.ports import Ports, free_port  # noqa: E402
from specbatch.server.process import ServerOptions, TritonProcess  # noqa: E402
from specbatch.server.stubs import stubs_of  # noqa: E402

logger = logging.getLogger("chaos")
CLIENT_TIMEOUT_S = 60.0
# (name, what is signalled: a stub by instance name, or "front" / "gateway", signal)
FAULTS = [
    ("kill -9 instance", "qwen3_specdec_0_1", signal.SIGKILL),
    ("kill -9 scheduler", "scheduler_0_0", signal.SIGKILL),
    ("kill -9 router", "router_0_0", signal.SIGKILL),
    ("kill -9 OpenAI front", "front", signal.SIGKILL),
    ("kill -9 gateway", "gateway", signal.SIGKILL),
    ("SIGSTOP instance (hang)", "qwen3_specdec_0_0", signal.SIGSTOP),
    ("kill -9 tritonserver", "tritonserver", signal.SIGKILL),
]
SERVER_ENV = {"SPECBATCH_INSTANCE_HANG_MS": "5000"}


@dataclass
class Pipeline:
    """A running server: where to reach it, how to find each process, how to stop it."""

    launcher: str
    http: str  # host:port of the gateway
    metrics: str
    front: str  # base URL of the OpenAI front
    triton_pid: Callable[[], int]
    helper_pid: Callable[[str], int]  # "front" or "gateway"
    stop: Callable[[], None]


def start_serve(log: Path) -> Pipeline:
    """`specbatch serve`, as a user starts it."""
    ports, front = Ports.free(), free_port()
    command = [
        sys.executable, "-m", "specbatch.cli", "serve", "--config=cpu", f"--http-port={ports.http}",
        f"--grpc-port={ports.grpc}", f"--metrics-port={ports.metrics}", f"--openai-port={front}",
    ]  # fmt: skip
    with open(log, "wb") as output:
        launcher = subprocess.Popen(
            command,
            cwd=ROOT,
            stdout=output,
            stderr=output,
            env={**os.environ, **SERVER_ENV},
            preexec_fn=exit_with_parent_preexec,
        )
    deadline = time.monotonic() + 300
    while "specbatch is ready" not in log.read_text(errors="replace"):
        if launcher.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"specbatch serve did not start; see {log}")
        time.sleep(0.5)

    def child(marker: str) -> int:
        return next(pid for pid, command in children(launcher.pid).items() if marker in command)

    def stop() -> None:
        launcher.send_signal(signal.SIGINT)
        launcher.wait(timeout=120)

    return Pipeline(
        "specbatch serve",
        f"127.0.0.1:{ports.http}",
        f"http://127.0.0.1:{ports.metrics}/metrics",
        f"http://127.0.0.1:{front}",
        triton_pid=lambda: child("tritonserver"),
        helper_pid=lambda name: child("specbatch.openai" if name == "front" else "specbatch.gateway"),
        stop=stop,
    )


def start_pod(log: Path, kserve: bool = False) -> Pipeline:
    """Plain tritonserver and the gateway as the pod's containers, with what deploy/ ships
    to bring stubs back: in the Kubernetes pod the gateway with --supervise (and the OpenAI
    front, told of a dead scheduler by it, on Triton's loopback gRPC); in the KServe pod
    `specbatch watch` in tritonserver's container (and the OpenAI front, which KServe does
    not run, outside the pod on the gateway's gRPC relay). A container that exits is
    started again (the kubelet's restartPolicy, played here by the launcher's own loop)."""
    options = ServerOptions(
        root=ROOT,
        config_name="cpu",
        ports=Ports.free(),
        env=SERVER_ENV,
        gateway_supervises=not kserve,
        watched_in_container=kserve,
    )
    server = TritonProcess(options)
    server.start(log)
    server.wait_ready()
    upstream = server.grpc_url if kserve else server.options.triton_grpc_url
    front = OpenAIFrontProcess(upstream, free_port(), "127.0.0.1")
    front.start(log)
    front.wait_ready()
    stopping: list[int] = []
    kubelet = threading.Thread(
        target=keep_running, args=(server, [server.gateway, front], stopping), daemon=True
    )
    kubelet.start()
    helpers = {"front": front, "gateway": server.gateway}

    def stop() -> None:
        stopping.append(signal.SIGTERM)
        front.stop()
        server.stop()

    return Pipeline(
        "plain tritonserver (deploy/kserve)" if kserve else "plain tritonserver (deploy/kubernetes)",
        server.http_url,
        server.metrics_url,
        front.url,
        triton_pid=lambda: server.server_pid,
        helper_pid=lambda name: helpers[name].process.pid,
        stop=stop,
    )


def children(parent: int) -> dict[int, str]:
    """{pid: command line} of the processes whose parent is ``parent``."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == parent:
                    found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except (OSError, IndexError, ValueError):
                continue
    return found


# ---- load ------------------------------------------------------------------------------


async def one_request(session: aiohttp.ClientSession, pipeline: Pipeline, pool: PromptPool, rng, t0) -> dict:
    """One request of the mix, through the gateway (or, one in ten, the OpenAI front)."""
    choice = pool.draw(rng)
    via = "openai" if rng.random() < 0.1 else "http"
    record = {"sent_s": time.monotonic() - t0, "via": via, "outcome": "never", "end_s": None}
    if via == "http":
        url = f"http://{pipeline.http}/v2/models/specbatch/generate"
        body = {"text_input": [choice.text], "max_tokens": choice.max_tokens or 16}
    else:
        url = f"{pipeline.front}/v1/completions"
        body = {"model": "specbatch", "prompt": choice.text, "max_tokens": choice.max_tokens or 16}
    try:
        async with session.post(
            url, json=body, timeout=aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_S)
        ) as reply:
            body = await reply.read()
            record["outcome"] = "ok" if reply.status == 200 else str(reply.status)
            if reply.status != 200:
                record["detail"] = body[:300].decode(errors="replace")
    except asyncio.TimeoutError:
        record["outcome"] = "never"
    except aiohttp.ClientError:
        record["outcome"] = "connection"
    record["end_s"] = time.monotonic() - t0
    return record


async def offer(
    pipeline: Pipeline, pool: PromptPool, rate: float, seconds: float, seed: int, during=None
) -> list:
    """Poisson arrivals at ``rate`` for ``seconds``; ``during(t0)`` runs beside them."""
    rng = random.Random(seed)
    t0 = time.monotonic()
    tasks = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        side = asyncio.ensure_future(during(t0)) if during else None
        next_s = rng.expovariate(rate)
        while next_s < seconds:
            await asyncio.sleep(max(0.0, next_s - (time.monotonic() - t0)))
            tasks.append(asyncio.ensure_future(one_request(session, pipeline, pool, rng, t0)))
            next_s += rng.expovariate(rate)
        records = await asyncio.gather(*tasks)
        side_result = await side if side else None
    return records, side_result


def capacity(pipeline: Pipeline, pool: PromptPool, offered: float, seconds: float) -> float:
    """Answers per second under sustained overload, the probe doubled while kept up."""

    def probe(rate: float) -> Probe:
        records, _ = asyncio.run(offer(pipeline, pool, rate, seconds, seed=1))
        served = [r for r in records if r["outcome"] == "ok"]
        if not served:
            raise RuntimeError(
                f"nothing was served while measuring capacity: {Counter(r['outcome'] for r in records)}"
            )
        refused = sum(r["outcome"] == "503" for r in records)
        return Probe(rate, len(records), len(served), refused, len(served) / max(r["end_s"] for r in served))

    best, probes = probe_until_overloaded(probe, offered)
    logger.info("capacity %.2f req/s (%s)", best.answered_rps, describe(probes))
    return best.answered_rps


# ---- faults ----------------------------------------------------------------------------


def ready(pipeline: Pipeline) -> bool:
    try:
        with urllib.request.urlopen(f"http://{pipeline.http}/v2/health/ready", timeout=2) as reply:
            return reply.status == 200
    except (urllib.error.URLError, OSError):
        return False


def instances_serving(pipeline: Pipeline) -> float:
    try:
        with urllib.request.urlopen(pipeline.metrics, timeout=2) as reply:
            text = reply.read().decode()
    except (urllib.error.URLError, OSError):
        return 0.0
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("specbatch_instances_serving")
    )


def serves(pipeline: Pipeline) -> bool:
    body = json.dumps(
        {"text_input": ["Instruction: Say hi.\nQuestion: \nGeneration:"], "max_tokens": 2}
    ).encode()
    request = urllib.request.Request(f"http://{pipeline.http}/v2/models/specbatch/generate", data=body)
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status == 200
    except (urllib.error.URLError, OSError):
        return False


def inject(pipeline: Pipeline, target: str, signum: int) -> int:
    if target == "tritonserver":
        pid = pipeline.triton_pid()
    elif target in ("front", "gateway"):
        pid = pipeline.helper_pid(target)
    else:
        pid = stub_pid(pipeline, target)
    os.kill(pid, signum)
    return pid


def stub_pid(pipeline: Pipeline, instance: str) -> int:
    [pid] = [pid for pid, name in stubs_of(pipeline.triton_pid()).items() if name == instance]
    return pid


async def watch_recovery(pipeline: Pipeline, fault: tuple, args: argparse.Namespace, t0: float) -> dict:
    """Inject the fault ``args.before`` seconds in, then sample readiness and the decoding
    instances in service until the window is over and both are back (or the limit)."""
    _, target, signum = fault
    await asyncio.sleep(max(0.0, args.before - (time.monotonic() - t0)))
    loop = asyncio.get_running_loop()
    pid = await loop.run_in_executor(None, inject, pipeline, target, signum)
    fault_s = time.monotonic() - t0
    samples = []  # (seconds after the fault, ready, instances in service)
    while True:
        since = time.monotonic() - t0 - fault_s
        samples.append(
            (
                since,
                await loop.run_in_executor(None, ready, pipeline),
                await loop.run_in_executor(None, instances_serving, pipeline),
            )
        )
        back = samples[-1][1] and samples[-1][2] >= 2
        if since >= args.recovery_limit or (back and time.monotonic() - t0 >= args.window):
            break
        await asyncio.sleep(0.2)
    if signum == signal.SIGSTOP:  # ended by the scheduler; make sure nothing is left stopped
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return {
        "fault_s": fault_s,
        "ready_s": _back_after(samples, lambda sample: sample[1]),
        "full_capacity_s": _back_after(samples, lambda sample: sample[1] and sample[2] >= 2),
    }


def _back_after(samples: list[tuple], good: Callable[[tuple], bool]) -> float | None:
    """Seconds after the fault from which every sample is good (0: none was bad); None if
    the last one is still bad."""
    if not good(samples[-1]):
        return None
    bad = [since for since, *_ in (s for s in samples if not good(s))]
    if not bad:
        return 0.0
    return next(s[0] for s in samples if s[0] > bad[-1])


def run_fault(pipeline: Pipeline, pool: PromptPool, rate: float, fault: tuple, args, seed: int) -> dict:
    records, recovery = asyncio.run(
        offer(
            pipeline,
            pool,
            rate,
            args.window,
            seed,
            during=lambda t0: watch_recovery(pipeline, fault, args, t0),
        )
    )
    fault_s = recovery["fault_s"]
    after = [r["end_s"] - fault_s for r in records if r["outcome"] == "ok" and r["sent_s"] > fault_s]
    recovery["serving_s"] = min(after) if after else None
    outcomes = Counter(r["outcome"] for r in records)
    errors = {k: v for k, v in outcomes.items() if k not in ("ok", "never")}
    row = {
        "launcher": pipeline.launcher,
        "fault": fault[0],
        "sent": len(records),
        "ok": outcomes["ok"],
        "errors": sum(errors.values()),
        "error_kinds": errors,
        "never": outcomes["never"],
        **recovery,
        "records": records,
    }
    logger.info(
        "%s / %s: %d sent, %d ok, %d errors %s, %d never answered; "
        "ready %s s, serving %s s, full capacity %s s after the fault",
        pipeline.launcher, fault[0], row["sent"], row["ok"], row["errors"], errors, row["never"],
        _fmt(recovery["ready_s"]), _fmt(recovery["serving_s"]), _fmt(recovery["full_capacity_s"]),
    )  # fmt: skip
    return row


def _fmt(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f}"


# ---- report ------------------------------------------------------------------------------


def markdown(rows: list[dict], header: str) -> str:
    lines = [
        header,
        "",
        "| launcher | fault | sent | ok | errors (kind: count) | never answered "
        "| ready again (s) | serving again (s) | full capacity (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        kinds = ", ".join(f"{k}: {v}" for k, v in sorted(row["error_kinds"].items())) or "-"
        lines.append(
            f"| {row['launcher']} | {row['fault']} | {row['sent']} | {row['ok']} | {row['errors']} ({kinds}) "
            f"| {row['never']} | {_fmt(row['ready_s'])} | {_fmt(row['serving_s'])} "
            f"| {_fmt(row['full_capacity_s'])} |"
        )
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    launchers = sorted({row["launcher"] for row in rows})
    faults = [fault[0] for fault in FAULTS]
    figure, axes = plt.subplots(len(launchers), 1, figsize=(10, 3.2 * len(launchers)), squeeze=False)
    for axis, launcher in zip(axes[:, 0], launchers, strict=True):
        mine = {row["fault"]: row for row in rows if row["launcher"] == launcher}
        x = range(len(faults))
        ok = [mine[f]["ok"] if f in mine else 0 for f in faults]
        err = [mine[f]["errors"] if f in mine else 0 for f in faults]
        never = [mine[f]["never"] if f in mine else 0 for f in faults]
        axis.bar(x, ok, label="ok", color="tab:green")
        axis.bar(x, err, bottom=ok, label="error answer", color="tab:orange")
        axis.bar(
            x,
            never,
            bottom=[a + b for a, b in zip(ok, err, strict=True)],
            label="never answered",
            color="tab:red",
        )
        axis.set_xticks(list(x), faults, fontsize=8)
        axis.set_ylabel("requests")
        axis.set_title(launcher)
        axis.legend(fontsize=8)
    save_figure(figure, path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "chaos")
    parser.add_argument("--launcher", choices=["serve", "pod", "kserve", "all"], default="all")
    parser.add_argument("--load", type=float, default=0.7, help="offered load, a share of measured capacity")
    parser.add_argument(
        "--probe-rate",
        type=float,
        default=40.0,
        help="req/s first offered to measure capacity (doubled while kept up)",
    )
    parser.add_argument("--probe-seconds", type=float, default=30.0)
    parser.add_argument("--window", type=float, default=40.0, help="seconds of arrivals per fault")
    parser.add_argument("--before", type=float, default=8.0, help="seconds into the window the fault comes")
    parser.add_argument("--recovery-limit", type=float, default=90.0)
    parser.add_argument("--plot", type=Path, default=ROOT / "docs" / "img" / "chaos.png")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    args.out.mkdir(parents=True, exist_ok=True)
    ensure_tiny_models(ROOT)
    pool = build_prompt_pool(load_profile(ROOT / "loadtest" / "profiles" / "mixed.yaml").workload)
    starters = {"serve": start_serve, "pod": start_pod, "kserve": lambda log: start_pod(log, kserve=True)}
    chosen = list(starters) if args.launcher == "all" else [args.launcher]
    rows = []
    with tqdm(total=len(chosen) * len(FAULTS), desc="faults") as progress:
        for launcher in chosen:
            pipeline = starters[launcher](args.out / f"{launcher}.log")
            try:
                rate = args.load * capacity(pipeline, pool, args.probe_rate, args.probe_seconds)
                logger.info(
                    "%s: offering %.2f req/s (%.0f %% of capacity)", pipeline.launcher, rate, 100 * args.load
                )
                for index, fault in enumerate(FAULTS):
                    rows.append(run_fault(pipeline, pool, rate, fault, args, seed=100 + index))
                    rows[-1]["offered_rate"] = rate
                    progress.update()
            finally:
                pipeline.stop()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    header = (
        f"commit {commit.stdout.strip()}, `python scripts/chaos.py`, {args.load:.0%} of measured capacity, "
        f"{args.window:.0f} s of arrivals per fault, the fault {args.before:.0f} s in"
    )
    table = markdown(rows, header)
    (args.out / "chaos.json").write_text(json.dumps(rows, indent=1))
    (args.out / "chaos.md").write_text(table + "\n")
    args.plot.parent.mkdir(parents=True, exist_ok=True)
    plot(rows, args.plot)
    print(table)
    return 1 if any(row["never"] for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())

"""`specbatch serve`: the whole pipeline on a real tritonserver, in one command.

Picks the model-config variant for the machine (two GPUs: the production config;
one GPU: gpu1; none: cpu on the embedded tiny pair, built on first use), starts the
server over both repositories, waits until it is ready, prints how to call it, and
forwards SIGINT/SIGTERM so in-flight requests finish before it exits.

Safe by default: every endpoint binds to loopback unless `host` says otherwise, and
Triton's administrative APIs (model repository and control, shared memory, logging,
trace) answer only requests carrying the admin key (SPECBATCH_ADMIN_KEY, or a random
key for this run), which the launcher keeps in `TritonProcess.options.admin_key`.
"""

from __future__ import annotations

import logging
import signal
import time
from pathlib import Path

from specbatch.server.admin import ADMIN_HEADER
from specbatch.server.children import ChildProcess, OpenAIFrontProcess
from specbatch.server.ports import Ports, check_ports_free
from specbatch.server.process import ServerOptions, TritonProcess

logger = logging.getLogger(__name__)

CONFIG_VARIANTS = ("auto", "default", "gpu1", "cpu", "cpu_production_shapes")
# where the cpu_production_shapes config finds its pair (random weights, production shapes)
PRODUCTION_SHAPES_DIR = ".models/production_shapes"


def project_root(start: Path | None = None) -> Path:
    """The directory holding model_repository/ and ensemble/: cwd or a parent, else the source checkout."""
    candidates = [start or Path.cwd(), *(start or Path.cwd()).parents, Path(__file__).resolve().parents[2]]
    for candidate in candidates:
        if (candidate / "model_repository").is_dir() and (candidate / "ensemble").is_dir():
            return candidate
    raise FileNotFoundError(
        "no model_repository/ and ensemble/ here or above; run from the specbatch checkout"
    )


def choose_config(requested: str) -> str | None:
    """The --model-config-name for `requested` (None: the production config.pbtxt)."""
    if requested not in CONFIG_VARIANTS:
        raise ValueError(f"unknown config {requested!r}: expected one of {', '.join(CONFIG_VARIANTS)}")
    if requested == "default":
        return None
    if requested != "auto":
        return requested
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return None if gpus >= 2 else "gpu1" if gpus == 1 else "cpu"


def ensure_tiny_models(root: Path) -> None:
    """Build the embedded tiny Qwen3 pair the cpu config points at, or bring an old build up to date.

    An existing pair is kept; only its tokenizer's chat template is refreshed, so a
    checkout that built the pair before the template changed serves the current one.
    """
    from specbatch.decoding import build_tiny_pair

    logger.info("tiny Qwen3 pair in %s", root / ".models" / "tiny")
    build_tiny_pair(root / ".models" / "tiny")


def ensure_production_shapes(root: Path) -> None:
    """Build the production-shaped random pair the cpu_production_shapes config points at
    (about 5 GB, about a minute the first time; kept afterwards)."""
    from specbatch.decoding.production_shapes import build_production_shapes

    logger.info("production-shaped Qwen3 pair in %s", root / PRODUCTION_SHAPES_DIR)
    build_production_shapes(root / PRODUCTION_SHAPES_DIR)


def usage_banner(
    process: TritonProcess, openai_port: int | None = None, public_host: str = "localhost"
) -> str:
    ports = process.options.ports
    openai = (
        f"  OpenAI   http://{public_host}:{openai_port}/v1   (completions, chat/completions, models)\n"
        if openai_port
        else ""
    )
    return (
        f"specbatch is ready\n"
        f"  HTTP     http://{public_host}:{ports.http}   (/v2/models/specbatch/generate, /generate_stream)\n"
        f"  gRPC     {public_host}:{ports.grpc}          (ModelStreamInfer)\n"
        f"  metrics  http://{public_host}:{ports.metrics}/metrics\n"
        f"{openai}"
        f"  admin    model repository, shared memory, logging and trace APIs need the header\n"
        f"           {ADMIN_HEADER}: <SPECBATCH_ADMIN_KEY> (unset: a random key, so they stay closed)\n"
        f"try:\n"
        f"  curl -s -X POST http://{public_host}:{ports.http}/v2/models/specbatch/generate \\\n"
        f'    -d \'{{"text_input": ["Instruction: Name three colours.\\nQuestion: \\nGeneration:"], '
        f'"max_tokens": 32}}\'\n'
    )


RESTART_BACKOFF_S = 10.0


def keep_running(
    process: TritonProcess, helpers: list[ChildProcess], stopping: list[int], poll_s: float = 0.5
) -> int:
    """Until a signal asks to stop: start again tritonserver (it can die of a fault of its
    own, e.g. Triton 2.51 aborts when a stub is killed inside its IPC) and any helper
    process (the gateway, the OpenAI front) that dies; then tritonserver's exit code."""
    assert process.process is not None
    next_restart_s = 0.0
    while (code := process.process.poll()) is None or not stopping:
        if stopping:
            time.sleep(poll_s)
            continue
        if code is not None and time.monotonic() >= next_restart_s:
            next_restart_s = time.monotonic() + RESTART_BACKOFF_S  # no faster than this in a crash loop
            process.restart_triton()
        for helper in helpers:
            if not helper.running():
                logger.error("%s exited with %s: starting it again", helper.what, helper.process.returncode)
                helper.start(helper.log_path)
        time.sleep(poll_s)
    return code


def serve(
    config: str = "auto",
    ports: Ports | None = None,
    host: str = "127.0.0.1",
    log_verbose: int = 0,
    openai_port: int | None = 9000,
) -> int:
    """Run until SIGINT/SIGTERM; returns tritonserver's exit code.

    With `openai_port`, the OpenAI-compatible front runs beside the server once it is
    ready, forwarding to its gRPC port; both get the signal and drain together. Raises
    PortInUseError, naming the port, before starting anything when a port is taken.
    """
    root = project_root()
    config_name = choose_config(config)
    if config_name == "cpu":
        ensure_tiny_models(root)
    elif config_name == "cpu_production_shapes":
        ensure_production_shapes(root)
    ports = ports or Ports()
    if openai_port:
        check_ports_free(host, {"OpenAI": openai_port})
    process = TritonProcess(
        ServerOptions(
            root=root,
            config_name=config_name,
            ports=ports,
            host=host,
            log_verbose=log_verbose,
            reserved_ports=(openai_port,) if openai_port else (),
        )
    )
    front = OpenAIFrontProcess(process.options.triton_grpc_url, openai_port, host) if openai_port else None
    received: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        received.append(signum)
        logger.info("received %s: draining in-flight requests", signal.Signals(signum).name)
        for child in (front.process if front else None, process.process):
            if child is not None and child.poll() is None:
                child.send_signal(signal.SIGTERM)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        process.start()
        process.wait_ready()
        process.supervise()
        if front is not None:
            front.start()
            front.wait_ready()
            process.fronts.append(front)
        print(usage_banner(process, openai_port), flush=True)
        code = keep_running(process, [c for c in (process.gateway, front) if c is not None], received)
    finally:
        if front is not None:
            front.stop()
        process.stop()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return 0 if received else code

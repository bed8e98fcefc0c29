"""`python -m specbatch.gateway`: Triton's endpoints behind a body limit and a relay that
answers what a dead scheduler held.

One process, one or more listeners, each forwarding to its own upstream: typically the
public HTTP port to Triton's loopback HTTP port and the public metrics port to Triton's
loopback metrics port (see specbatch.gateway.app for why), and the public gRPC port to
Triton's loopback gRPC port (see specbatch.gateway.grpc_relay). SIGUSR1 says the
scheduler died: every request waiting on it is answered, 503 over HTTP and a final error
response on a gRPC stream (see specbatch.serving.held).

With ``--supervise`` (a pod whose containers share one process namespace, where
tritonserver runs without `specbatch serve`'s launcher) the gateway also watches
Triton's stub processes and brings back a model whose stub dies, through Triton's
repository API on the first listener's upstream, with the admin key from
SPECBATCH_ADMIN_KEY (see specbatch.server.supervisor); when the scheduler dies it also
tells the pod's OpenAI front (SIGUSR1).

With ``--control-port`` (a pod whose containers cannot see each other's processes, where
`specbatch watch` runs tritonserver and watches its stubs) the same news comes as
``POST /scheduler-lost`` on that port, which listens on loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import urllib.parse
from collections.abc import Callable

from aiohttp import web

from specbatch.gateway.app import DEFAULT_MAX_BODY, HELD, MAX_BODY_CEILING, build_app
from specbatch.gateway.grpc_relay import start_grpc_relay
from specbatch.server.admin import ADMIN_KEY_ENV, RepositoryClient
from specbatch.server.stubs import ModelRestarts, processes_running, stubs_of, tritonserver_pids
from specbatch.server.supervisor import StubSupervisor
from specbatch.serving.held import HeldRequests

logger = logging.getLogger("specbatch.gateway")
MAX_BODY_ENV = "SPECBATCH_MAX_BODY_BYTES"


def route(text: str) -> tuple[int, str]:
    """``PORT=HOST:PORT``, e.g. ``8001=127.0.0.1:8011``."""
    port, sep, upstream = text.partition("=")
    if not sep or not port.isdigit() or not upstream:
        raise argparse.ArgumentTypeError(f"expected PORT=HOST:PORT, got {text!r}")
    return int(port), upstream


def listener(text: str) -> tuple[int, str]:
    """An HTTP ``PORT=UPSTREAM``, e.g. ``8000=127.0.0.1:8010``."""
    port, upstream = route(text)
    return port, upstream if "://" in upstream else f"http://{upstream}"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m specbatch.gateway", description=__doc__)
    parser.add_argument(
        "--listen",
        type=listener,
        action="append",
        required=True,
        metavar="PORT=UPSTREAM",
        help="serve PORT, forwarding to UPSTREAM (host:port); repeatable",
    )
    parser.add_argument(
        "--listen-grpc",
        type=route,
        action="append",
        default=[],
        metavar="PORT=UPSTREAM",
        help="serve gRPC on PORT, relaying to Triton's gRPC at UPSTREAM (host:port); repeatable",
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default loopback; 0.0.0.0 for every interface)"
    )
    parser.add_argument(
        "--max-body-bytes",
        type=int,
        default=int(os.environ.get(MAX_BODY_ENV, DEFAULT_MAX_BODY)),
        help=f"larger request bodies get 413 (default {DEFAULT_MAX_BODY}, at most {MAX_BODY_CEILING}; "
        f"env {MAX_BODY_ENV})",
    )
    parser.add_argument(
        "--shutdown-timeout", type=float, default=30.0, help="seconds in-flight requests get on SIGTERM"
    )
    parser.add_argument(
        "--supervise",
        action="store_true",
        help=f"bring back a Triton model whose stub process dies (needs {ADMIN_KEY_ENV} and a shared "
        "process namespace with tritonserver)",
    )
    parser.add_argument(
        "--control-port",
        type=int,
        default=None,
        help="listen on 127.0.0.1:PORT for POST /scheduler-lost (from `specbatch watch`)",
    )
    return parser


async def start_control(port: int, scheduler_lost: Callable[[], None]) -> web.AppRunner:
    """The loopback-only control listener: ``POST /scheduler-lost`` answers what the dead
    scheduler held, as SIGUSR1 does where the watcher can signal this process."""

    async def lost(_request: web.Request) -> web.Response:
        scheduler_lost()
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/scheduler-lost", lost)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    logger.info("control listener on 127.0.0.1:%d", port)
    return runner


async def run_gateway(args: argparse.Namespace) -> None:
    runners = []
    apps = []
    for port, upstream in args.listen:
        apps.append(build_app(upstream, args.max_body_bytes))
        runner = web.AppRunner(
            apps[-1],
            handler_cancellation=True,
            shutdown_timeout=args.shutdown_timeout,
            access_log=None,
        )
        await runner.setup()
        await web.TCPSite(runner, args.host, port).start()
        runners.append(runner)
        logger.info(
            "serving %s:%d -> %s (bodies up to %d bytes)", args.host, port, upstream, args.max_body_bytes
        )
    held_on_streams = HeldRequests()
    relays = []
    for port, upstream in args.listen_grpc:
        relays.append(await start_grpc_relay(args.host, port, upstream, held_on_streams))
        logger.info("serving gRPC %s:%d -> %s", args.host, port, upstream)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)

    def scheduler_lost() -> None:
        answered = sum(app[HELD].fail_all() for app in apps)
        logger.warning("the scheduler died: %d HTTP request(s) waiting on it answered 503", answered)
        held_on_streams.fail_all()

    loop.add_signal_handler(signal.SIGUSR1, scheduler_lost)
    if args.control_port is not None:
        runners.append(await start_control(args.control_port, scheduler_lost))
    supervisor = None
    if args.supervise:
        _, triton_http = args.listen[0]
        restarts = ModelRestarts(RepositoryClient(triton_http, os.environ[ADMIN_KEY_ENV]))
        port = urllib.parse.urlsplit(triton_http).port

        def died(model: str) -> None:
            if model == "scheduler":
                loop.call_soon_threadsafe(scheduler_lost)
                for pid in processes_running("specbatch.openai"):  # the pod's OpenAI front
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGUSR1)

        def stubs() -> dict[int, str]:
            return {pid: name for server in tritonserver_pids(port) for pid, name in stubs_of(server).items()}

        supervisor = StubSupervisor(
            stubs,
            restarts.reload,
            restarts.restart,
            on_death=died,
            server=lambda: tritonserver_pids(port),
            ready_models=restarts.ready_models,
        )
        supervisor.start()
    await stop.wait()
    if supervisor is not None:
        supervisor.stop()
    logger.info("stopping: in-flight requests get up to %.0f s", args.shutdown_timeout)
    await asyncio.gather(
        *(runner.cleanup() for runner in runners),
        *(relay.stop(args.shutdown_timeout) for relay in relays),
    )


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if not 0 < args.max_body_bytes <= MAX_BODY_CEILING:
        raise SystemExit(f"--max-body-bytes must be between 1 and {MAX_BODY_CEILING}")
    if args.supervise and not os.environ.get(ADMIN_KEY_ENV):
        raise SystemExit(f"--supervise reloads models through the repository API: set {ADMIN_KEY_ENV}")
    asyncio.run(run_gateway(args))


if __name__ == "__main__":
    main()

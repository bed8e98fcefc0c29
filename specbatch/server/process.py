"""A tritonserver child process over the specbatch repositories: start, wait, stop.

Used by `specbatch serve` and by the integration tests, so both run the server the
same way: both model repositories in explicit model control (every model loaded at
start; the repository API, restricted to the admin key, can then reload one), the
chosen config variant, loopback ports, instances brought back when their process dies,
and a stop by process id that lets in-flight requests finish.

Triton's own listeners are never the ones users reach: they bind loopback ports of
their own, and the gateway (specbatch.gateway: a body limit, honest 503s, and a gRPC
relay that answers what a dead scheduler held) serves the public HTTP, gRPC and metrics
ports in front of them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from specbatch.lifeline import exit_with_parent_preexec
from specbatch.server.admin import ADMIN_KEY_ENV, RepositoryClient, admin_key, restriction_arguments
from specbatch.server.binary import TritonInstallation, find_tritonserver
from specbatch.server.children import ChildProcess, GatewayProcess
from specbatch.server.ports import Ports, check_ports_free, free_port
from specbatch.server.shm_regions import remove_stale_regions
from specbatch.server.stubs import ModelRestarts, started_at, stubs_of, tritonserver_child
from specbatch.server.supervisor import StubSupervisor

logger = logging.getLogger(__name__)


LOOPBACK_PORT_FIELDS = ("triton_http_port", "triton_grpc_port", "triton_metrics_port", "gateway_control_port")


@dataclass
class ServerOptions:
    """What varies between a production start and a test start.

    The public endpoints (`ports`) bind to loopback unless `host` says otherwise, and the
    administrative APIs always need `admin_key` (SPECBATCH_ADMIN_KEY, else random for
    this server). Triton's listeners bind loopback `triton_http_port`, `triton_grpc_port`
    and `triton_metrics_port`, behind the gateway on the public ones.
    """

    root: Path
    config_name: str | None = None
    ports: Ports = field(default_factory=Ports)
    host: str = "127.0.0.1"
    exit_timeout_s: int = 30
    log_verbose: int = 0
    env: dict[str, str] = field(default_factory=dict)
    only_model: str | None = None
    admin_key: str = field(default_factory=admin_key, repr=False)
    # Triton's loopback listeners and the gateway's control port: 0 is a free port chosen
    # apart from `ports` and `reserved_ports`, which nothing binds until after tritonserver.
    triton_http_port: int = 0
    triton_grpc_port: int = 0
    triton_metrics_port: int = 0
    max_body_bytes: int | None = None
    gateway_supervises: bool = False  # as in a pod: the gateway, not the launcher, brings stubs back
    # As in a KServe pod: `specbatch watch` runs tritonserver and brings its stubs back, and
    # tells the gateway of a dead scheduler on the gateway's loopback control port.
    watched_in_container: bool = False
    gateway_control_port: int = 0
    reserved_ports: tuple[int, ...] = ()  # bound by something else of this deployment (the OpenAI front)

    def __post_init__(self) -> None:
        """Choose each loopback port left at 0, none equal to a public, reserved or other chosen one."""
        taken = {*self.ports.named().values(), *self.reserved_ports}
        for name in LOOPBACK_PORT_FIELDS:
            if getattr(self, name) == 0:
                setattr(self, name, free_port(avoid=taken))
            taken.add(getattr(self, name))

    def arguments(self) -> list[str]:
        """Both repositories and every model, or with `only_model` that one model alone."""
        if self.only_model:
            repositories = [f"--model-repository={self.root / 'model_repository'}"]
        else:
            repositories = [
                f"--model-repository={self.root / 'model_repository'}",
                f"--model-repository={self.root / 'ensemble'}",
            ]
        args = [
            *repositories,
            "--model-control-mode=explicit",
            f"--load-model={self.only_model or '*'}",
            "--http-address=127.0.0.1",
            "--grpc-address=127.0.0.1",
            "--metrics-address=127.0.0.1",
            f"--http-port={self.triton_http_port}",
            f"--grpc-port={self.triton_grpc_port}",
            f"--metrics-port={self.triton_metrics_port}",
            "--allow-metrics=true",
            "--metrics-config=histogram_latencies=true",
            f"--exit-timeout-secs={self.exit_timeout_s}",
            f"--log-verbose={self.log_verbose}",
            *restriction_arguments(self.admin_key),
        ]
        if self.config_name:
            args.append(f"--model-config-name={self.config_name}")
        return args

    def gateway(self) -> GatewayProcess:
        """The front on the public HTTP, gRPC and metrics ports."""
        routes = {self.ports.http: self.triton_http_port, self.ports.metrics: self.triton_metrics_port}
        key = self.admin_key if self.gateway_supervises else None
        return GatewayProcess(
            self.host,
            routes,
            {self.ports.grpc: self.triton_grpc_port},
            self.max_body_bytes,
            supervise_with_key=key,
            control_port=self.gateway_control_port if self.watched_in_container else None,
        )

    @property
    def triton_grpc_url(self) -> str:
        """Triton's own gRPC listener, for a front of ours on this machine (no relay hop)."""
        return f"127.0.0.1:{self.triton_grpc_port}"


class ServerStartError(RuntimeError):
    """tritonserver exited or never became ready; the message ends with its log."""


class TritonProcess:
    """One running tritonserver; stop() always ends it, by process id."""

    def __init__(self, options: ServerOptions, installation: TritonInstallation | None = None) -> None:
        self.options = options
        self.installation = installation or find_tritonserver()
        self.process: subprocess.Popen | None = None
        self.gateway = options.gateway()
        # Told (SIGUSR1) when the scheduler dies, to answer what they have waiting on it.
        self.fronts: list[ChildProcess] = [self.gateway]
        self.log_path: Path | None = None
        self.supervisor: StubSupervisor | None = None

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.options.ports.http}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.options.ports.grpc}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.options.ports.metrics}/metrics"

    def repository(self) -> RepositoryClient:
        """The model-repository API of this server (on Triton's own loopback port, so it
        works whatever the gateway is doing), with its admin key."""
        return RepositoryClient(f"127.0.0.1:{self.options.triton_http_port}", self.options.admin_key)

    def start(self, log_path: Path | None = None) -> None:
        """Launch the server and its gateway; their output goes to `log_path` (else inherited).

        Raises PortInUseError, naming the port, before starting anything when a port is taken.
        """
        options = self.options
        check_ports_free(options.host, options.ports.named())
        self._start_triton(log_path)
        self.gateway.start(log_path)

    def restart_triton(self) -> None:
        """Start tritonserver again after it died (the gateway, the fronts and the ports
        stay); the supervisor learns the new server's stubs."""
        logger.error("tritonserver exited with %s: starting it again", self._returncode())
        self._start_triton(self.log_path)

    def _start_triton(self, log_path: Path | None) -> None:
        inner = {
            "Triton HTTP": self.options.triton_http_port,
            "Triton gRPC": self.options.triton_grpc_port,
            "Triton metrics": self.options.triton_metrics_port,
        }
        check_ports_free("127.0.0.1", inner)
        remove_stale_regions()
        command = self.installation.command(*self.options.arguments())
        env = self.installation.environment()
        env.update(self.options.env)
        if self.options.watched_in_container:
            lost = f"http://127.0.0.1:{self.options.gateway_control_port}/scheduler-lost"
            watch = [str(Path(sys.executable).with_name("specbatch")), "watch", f"--notify={lost}", "--"]
            command = [*watch, *command]
            env[ADMIN_KEY_ENV] = self.options.admin_key
        self.log_path = log_path
        output = open(log_path, "ab") if log_path else None  # noqa: SIM115 - owned by the child
        logger.info("starting %s", " ".join(command).replace(self.options.admin_key, "<admin key>"))
        self.process = subprocess.Popen(
            command,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT if output else None,
            cwd=self.options.root,
            preexec_fn=exit_with_parent_preexec,
        )
        if output:
            output.close()

    def stub_pids(self) -> dict[str, int]:
        """{model instance name: pid} of the server's Python backend stub processes (one per
        instance; while a model reloads, the newest of a name's two)."""
        stubs = sorted(self.stubs().items(), key=lambda item: started_at(item[0]))
        return {name: pid for pid, name in stubs}

    @property
    def server_pid(self) -> int | None:
        """tritonserver's pid: the process started, or under `specbatch watch` its child."""
        if self.process is None:
            return None
        return tritonserver_child(self.process.pid) if self.options.watched_in_container else self.process.pid

    def stubs(self) -> dict[int, str]:
        """{pid: model instance name} of every Python backend stub process of the server."""
        server = self.server_pid
        return {} if server is None else stubs_of(server)

    def supervise(self) -> StubSupervisor:
        """Bring back any model of the pipeline whose stub process dies (see supervisor)."""
        restarts = ModelRestarts(self.repository())
        self.supervisor = StubSupervisor(
            self.stubs,
            restarts.reload,
            restarts.restart,
            on_death=self._model_died,
            server=lambda: None if self.process is None else self.process.pid,
            ready_models=restarts.ready_models,
        )
        self.supervisor.check()
        self.supervisor.start()
        return self.supervisor

    def _model_died(self, model: str) -> None:
        """Triton never answers what a dead scheduler held: the fronts answer it (503)."""
        if model == "scheduler":
            for front in self.fronts:
                if front.running():
                    front.process.send_signal(signal.SIGUSR1)

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        """Block until /v2/health/ready answers 200 through the gateway; raise with the log
        tail if it never does."""
        deadline = time.monotonic() + timeout_s
        url = f"http://{self.http_url}/v2/health/ready"
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                raise ServerStartError(f"tritonserver exited with {self._returncode()}\n{self.log_tail()}")
            if not self.gateway.running():
                raise ServerStartError(f"the HTTP gateway exited\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(url, timeout=2) as reply:
                    if reply.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        raise ServerStartError(f"tritonserver not ready after {timeout_s:.0f}s\n{self.log_tail()}")

    def stop(self, timeout_s: float | None = None) -> int | None:
        """SIGTERM (Triton drains in-flight requests), then SIGKILL if it outlives the timeout;
        then SIGKILL any of its stub processes that outlived it, so nothing it started stays."""
        if self.supervisor is not None:
            self.supervisor.stop()
        try:
            return self._stop_triton(timeout_s)
        finally:
            self.gateway.stop()  # after Triton, so the answers it drained still reach their clients

    def _stop_triton(self, timeout_s: float | None) -> int | None:
        if self.process is None or self.process.poll() is not None:
            return self._returncode()
        stubs = list(self.stubs())
        timeout_s = timeout_s if timeout_s is not None else self.options.exit_timeout_s + 15
        os.kill(self.process.pid, signal.SIGTERM)
        try:
            code = self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            logger.warning("tritonserver %d did not stop in %.0fs; killing it", self.process.pid, timeout_s)
            os.kill(self.process.pid, signal.SIGKILL)
            code = self.process.wait()
        for pid in stubs:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                logger.warning("stub process %d outlived tritonserver; killed it", pid)
        return code

    def log_tail(self, lines: int = 40) -> str:
        if not self.log_path or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def _returncode(self) -> int | None:
        return None if self.process is None else self.process.returncode

    def __enter__(self) -> TritonProcess:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

"""The helper processes beside tritonserver: the HTTP gateway and the OpenAI front.

Each is a separate process (not a thread of the launcher) so a slow client or a crash
in it never touches the server, and so a deployment can run it as a sidecar container
with the same command. Each is started, waited on until it answers, and stopped by
process id, like the server.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from specbatch.lifeline import exit_with_parent_preexec
from specbatch.server.admin import ADMIN_KEY_ENV

logger = logging.getLogger(__name__)


class ChildProcess:
    """``python -m <module> <args>``, ready once ``ready_url`` answers 200."""

    what = "a helper process"
    any_status_is_ready = False  # True: any HTTP answer means the process is up

    def __init__(
        self, module: str, args: list[str], ready_url: str, env: dict[str, str] | None = None
    ) -> None:
        """``env``: variables added to this process's environment for the child."""
        self.module = module
        self.args = args
        self.ready_url = ready_url
        self.env = env or {}
        self.process: subprocess.Popen | None = None
        self.log_path: Path | None = None

    def command(self) -> list[str]:
        return [sys.executable, "-m", self.module, *self.args]

    def start(self, log_path: Path | None = None) -> None:
        self.log_path = log_path
        output = open(log_path, "ab") if log_path else None  # noqa: SIM115 - owned by the child
        logger.info("starting %s", " ".join(self.command()))
        self.process = subprocess.Popen(
            self.command(),
            env={**os.environ, **self.env},
            stdout=output,
            stderr=subprocess.STDOUT if output else None,
            preexec_fn=exit_with_parent_preexec,
        )
        if output:
            output.close()

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Block until ``ready_url`` answers 200; raise if the process exits or never does."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                raise RuntimeError(f"{self.what} exited with {self._returncode()}\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.ready_url, timeout=2) as reply:
                    if reply.status == 200:
                        return
            except urllib.error.HTTPError:
                if self.any_status_is_ready:
                    return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.what} did not answer within {timeout_s:.0f}s\n{self.log_tail()}")

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout_s: float = 40.0) -> int | None:
        """SIGTERM (in-flight requests get the process's shutdown timeout), then SIGKILL."""
        if not self.running():
            return self._returncode()
        os.kill(self.process.pid, signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.kill(self.process.pid, signal.SIGKILL)
            return self.process.wait()

    def _returncode(self) -> int | None:
        return None if self.process is None else self.process.returncode

    def log_tail(self, lines: int = 30) -> str:
        if not self.log_path or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


class OpenAIFrontProcess(ChildProcess):
    """`python -m specbatch.openai` forwarding to the server's gRPC endpoint."""

    what = "the OpenAI front"

    def __init__(self, grpc_url: str, port: int, host: str = "127.0.0.1", *extra_args: str) -> None:
        self.port = port
        args = [f"--grpc-url={grpc_url}", f"--host={host}", f"--port={port}", *extra_args]
        super().__init__("specbatch.openai", args, f"{self.url}/v1/models")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class GatewayProcess(ChildProcess):
    """`python -m specbatch.gateway`: each public port forwarding to Triton's loopback one."""

    what = "the gateway"
    any_status_is_ready = True  # it answers 503 while Triton behind it is not up yet

    def __init__(
        self,
        host: str,
        routes: dict[int, int],
        grpc_routes: dict[int, int],
        max_body_bytes: int | None = None,
        supervise_with_key: str | None = None,
        control_port: int | None = None,
    ) -> None:
        """``routes`` and ``grpc_routes``: {public port: Triton's loopback port}, HTTP (the
        first is the inference one) and gRPC. With ``supervise_with_key`` (the admin key)
        the gateway brings back dead Triton stubs itself, as in a pod (`--supervise`); with
        ``control_port`` it hears of a dead scheduler on that loopback port instead, from
        `specbatch watch`, as in a KServe pod."""
        listeners = [f"--listen={public}=127.0.0.1:{inner}" for public, inner in routes.items()]
        listeners += [f"--listen-grpc={public}=127.0.0.1:{inner}" for public, inner in grpc_routes.items()]
        args = [f"--host={host}", *listeners]
        if max_body_bytes is not None:
            args.append(f"--max-body-bytes={max_body_bytes}")
        if control_port is not None:
            args.append(f"--control-port={control_port}")
        env = {}
        if supervise_with_key is not None:
            args.append("--supervise")
            env[ADMIN_KEY_ENV] = supervise_with_key
        http = next(iter(routes))
        super().__init__("specbatch.gateway", args, f"http://127.0.0.1:{http}/v2/health/live", env)

"""The OpenAI-compatible front as a child process beside tritonserver: start, wait, stop.

It is a separate process (not a thread of the launcher) so a slow client or a crash
in the front never touches the server, and so a deployment can run it as a sidecar
container with the same command. Stopped by process id, like the server.
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

logger = logging.getLogger(__name__)


class OpenAIFrontProcess:
    """`python -m specbatch.openai` forwarding to the server's gRPC endpoint."""

    def __init__(self, grpc_url: str, port: int, host: str = "127.0.0.1", *extra_args: str) -> None:
        self.grpc_url = grpc_url
        self.port = port
        self.host = host
        self.extra_args = extra_args
        self.process: subprocess.Popen | None = None
        self.log_path: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "specbatch.openai",
            f"--grpc-url={self.grpc_url}",
            f"--host={self.host}",
            f"--port={self.port}",
            *self.extra_args,
        ]

    def start(self, log_path: Path | None = None) -> None:
        self.log_path = log_path
        output = open(log_path, "ab") if log_path else None  # noqa: SIM115 - owned by the child
        logger.info("starting %s", " ".join(self.command()))
        self.process = subprocess.Popen(
            self.command(), stdout=output, stderr=subprocess.STDOUT if output else None
        )
        if output:
            output.close()

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Block until the front answers /v1/models; raise if it exits or never does."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                raise RuntimeError(f"the OpenAI front exited with {self._returncode()}\n{self._log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/v1/models", timeout=2) as reply:
                    if reply.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        raise RuntimeError(f"the OpenAI front did not answer within {timeout_s:.0f}s\n{self._log_tail()}")

    def stop(self, timeout_s: float = 40.0) -> int | None:
        """SIGTERM (in-flight requests get the front's shutdown timeout), then SIGKILL."""
        if self.process is None or self.process.poll() is not None:
            return self._returncode()
        os.kill(self.process.pid, signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.kill(self.process.pid, signal.SIGKILL)
            return self.process.wait()

    def _returncode(self) -> int | None:
        return None if self.process is None else self.process.returncode

    def _log_tail(self, lines: int = 30) -> str:
        if not self.log_path or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

"""`specbatch watch -- tritonserver ...`: tritonserver run as a child, its stub processes
watched from inside its own container.

Where the containers of a pod cannot share one process namespace (KServe's
ServingRuntime has no such field), nothing beside tritonserver can see its Python
backend stubs, so a dead router, scheduler or decoding instance would never come back.
This command is the container's entry point instead: it starts tritonserver with the
arguments after ``--``, brings back a model whose stub dies (the stub supervisor, through
the repository API on Triton's loopback HTTP port with SPECBATCH_ADMIN_KEY), and, when
the scheduler dies, tells each ``--notify`` URL (the gateway's loopback control port) so
that what the dead scheduler held is answered. SIGTERM and SIGINT go to tritonserver,
which drains; the command exits with tritonserver's status, so the kubelet restarts the
container when tritonserver dies.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import urllib.error
import urllib.request
from collections.abc import Sequence

from specbatch.lifeline import exit_with_parent_preexec
from specbatch.server.admin import RepositoryClient
from specbatch.server.shm_regions import remove_stale_regions
from specbatch.server.stubs import ModelRestarts, stubs_of
from specbatch.server.supervisor import StubSupervisor

logger = logging.getLogger(__name__)
NOTIFY_TIMEOUT_S = 2.0


def http_port_of(command: Sequence[str]) -> int:
    """The ``--http-port`` tritonserver is told to listen on (8000, Triton's default, without one)."""
    for index, arg in enumerate(command):
        if arg.startswith("--http-port="):
            return int(arg.partition("=")[2])
        if arg == "--http-port" and index + 1 < len(command):
            return int(command[index + 1])
    return 8000


def notify(urls: Sequence[str]) -> None:
    """POST to each URL, once; a front that does not answer is logged, not waited for."""
    for url in urls:
        try:
            with urllib.request.urlopen(urllib.request.Request(url, data=b"", method="POST"),
                                        timeout=NOTIFY_TIMEOUT_S):
                pass
        except (urllib.error.URLError, OSError) as exc:
            logger.error("could not tell %s that the scheduler died: %s", url, exc)


def run_watched(command: Sequence[str], admin_key: str, notify_urls: Sequence[str] = ()) -> int:
    """Run ``command`` (tritonserver and its arguments) until it exits, bringing back every
    model whose stub process dies; tritonserver's exit status (128 + signal if killed)."""
    remove_stale_regions()  # a container restarted after tritonserver was killed keeps /dev/shm
    server = subprocess.Popen(list(command), preexec_fn=exit_with_parent_preexec)
    logger.info("tritonserver started (pid %d); watching its stub processes", server.pid)

    def forward(signum: int, _frame: object) -> None:
        server.send_signal(signum)

    previous = {signum: signal.signal(signum, forward) for signum in (signal.SIGTERM, signal.SIGINT)}
    restarts = ModelRestarts(RepositoryClient(f"127.0.0.1:{http_port_of(command)}", admin_key))
    supervisor = StubSupervisor(
        lambda: stubs_of(server.pid),
        restarts.reload,
        restarts.restart,
        on_death=lambda model: notify(notify_urls) if model == "scheduler" else None,
        server=lambda: server.pid,
        ready_models=restarts.ready_models,
    )
    supervisor.start()
    status = server.wait()
    supervisor.stop()
    for signum, handler in previous.items():
        signal.signal(signum, handler)
    logger.info("tritonserver exited with %d", status)
    return 128 - status if status < 0 else status

"""Triton's Python backend stub processes, found by /proc, and bringing a model back
through the repository API: what the stub supervisor watches and calls.

Used by the launcher (`specbatch serve`, the tests), which started tritonserver and
knows its pid, and by the gateway in a pod (`--supervise`), which shares the pod's
process namespace and finds tritonserver by its command line.
"""

from __future__ import annotations

from pathlib import Path

from specbatch.server.admin import RepositoryClient


def _processes() -> dict[int, tuple[int, list[bytes]]]:
    """{pid: (parent pid, argv)} of every process this one can see."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        found[int(entry.name)] = (parent, argv)
    return found


def stubs_of(server_pid: int) -> dict[int, str]:
    """{pid: model instance name} of the stub processes of the tritonserver ``server_pid``
    (each its child, naming its instance on its command line)."""
    return {
        pid: argv[8].decode(errors="replace")
        for pid, (parent, argv) in _processes().items()
        if parent == server_pid and len(argv) > 8 and b"python_backend_stub" in argv[0]
    }


def tritonserver_pids(http_port: int) -> tuple[int, ...]:
    """The running tritonserver(s) with HTTP on ``http_port`` that this process can see
    (in a pod sharing its process namespace: the pod's one)."""
    flag = f"--http-port={http_port}".encode()
    return tuple(
        sorted(
            pid
            for pid, (_, argv) in _processes().items()
            if argv[0].endswith(b"tritonserver") and flag in argv
        )
    )


def started_at(pid: int) -> int:
    """When ``pid`` started (clock ticks since boot; 0 if it is gone): process ids wrap
    around, so the newer of two processes is the one started later, not the higher pid."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return 0


def tritonserver_child(parent_pid: int) -> int | None:
    """The tritonserver started by ``parent_pid`` (`specbatch watch`), if it runs."""
    found = [
        pid for pid, (parent, argv) in _processes().items()
        if parent == parent_pid and argv[0].endswith(b"tritonserver")
    ]
    return min(found, default=None)


def processes_running(module: str) -> list[int]:
    """The pids of ``python -m <module>`` processes in sight."""
    return sorted(pid for pid, (_, argv) in _processes().items() if module.encode() in argv[1:3])


class ModelRestarts:
    """Bringing a model back through the repository API (explicit model control)."""

    def __init__(self, repository: RepositoryClient) -> None:
        self._repository = repository

    def reload(self, model: str) -> None:
        """A new set of instances; the old set is retired once the new one is ready. Triton
        does nothing for a load of a loaded model with the same configuration, so the
        configuration it reloads with carries the next restart generation (counted in the
        configuration itself: whoever reloads next, even a restarted watcher, goes on)."""
        config = self._repository.config(model)
        parameters = config.setdefault("parameters", {})
        current = parameters.get("restart_generation", {}).get("string_value", "0")
        parameters["restart_generation"] = {"string_value": str(int(current) + 1)}
        self._repository.load(model, config)

    def ready_models(self) -> set[str]:
        return {entry["name"] for entry in self._repository.index() if entry.get("state") == "READY"}

    def restart(self, model: str) -> None:
        """Unload, then load: the model is not ready meanwhile."""
        self._repository.unload(model)
        self._repository.load(model)

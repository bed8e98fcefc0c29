"""No process outlives what started it.

Two ways, for two kinds of child. A child we start ourselves asks the kernel for a
signal when its parent dies (`exit_with_parent_preexec`, Linux's PR_SET_PDEATHSIG).
A process started by someone else's code — Triton's Python backend stubs, whose
scheduler and instance threads would otherwise keep a stub alive after tritonserver
died — gets a watcher (`exit_with_parent`): a small shell process that ends it with
SIGKILL once its parent is gone. The watcher is a process, not a thread, because a
thread needs the GIL, and a stub whose parent died has threads blocked for good inside
the backend's IPC holding it; an answer the stub still owed has nobody to go to anyway.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys

_PR_SET_PDEATHSIG = 1
POLL_S = 0.5
# Looked up once, here: between fork and exec the child only calls it (no dlopen there,
# whose lock another thread of the parent may have held at the fork).
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None


def exit_with_parent_preexec() -> None:
    """For ``subprocess.Popen(preexec_fn=...)``: SIGTERM this child when its parent dies."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def _alive(pid: int) -> str:
    """A shell test: ``pid`` exists and is not a zombie."""
    return f'[ -d /proc/{pid} ] && ! grep -q "^State:.*Z" /proc/{pid}/status 2>/dev/null'


def exit_with_parent(what: str = "this process") -> subprocess.Popen:
    """Watch the current parent process: when it has gone (even before this was called:
    the parent is then init), this process is ended at once with SIGKILL. The watcher
    exits with this process."""
    parent, me = os.getppid(), os.getpid()
    # Its own session, deaf to the signals a shutdown sends this process's group: it must
    # outlive its parent's last act to do its job.
    script = (
        "trap '' TERM INT HUP; "
        f"[ {parent} -ne 1 ] && while {_alive(parent)} && {_alive(me)}; do sleep {POLL_S}; done; "
        f'if {_alive(me)}; then echo "the parent process {parent} of {what} is gone: ending it" >&2; '
        f"kill -9 {me}; fi"
    )
    return subprocess.Popen(
        ["/bin/sh", "-c", script], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True
    )

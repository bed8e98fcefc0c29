"""No process outlives what started it.

Two ways, for two kinds of child. A child we start ourselves asks the kernel for a
signal when its parent dies (`exit_with_parent_preexec`, Linux's PR_SET_PDEATHSIG).
A process started by someone else's code — Triton's Python backend stubs, whose
scheduler and instance threads would otherwise keep a stub alive after tritonserver
died — watches its parent from a daemon thread and exits when it is gone
(`exit_with_parent`): an answer it still owed has nobody left to go to.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

_PR_SET_PDEATHSIG = 1
POLL_S = 0.5


def exit_with_parent_preexec() -> None:
    """For ``subprocess.Popen(preexec_fn=...)``: SIGTERM this child when its parent dies."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def exit_with_parent(what: str = "this process") -> threading.Thread:
    """Exit at once (status 1) when the current parent process has gone, even mid-work
    (at once, too, when it went before this was called: the parent is then init)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent != 1:
            time.sleep(POLL_S)
        # Straight to stderr: in a Triton stub, logging goes through the dead parent and blocks.
        os.write(2, f"the parent process {parent} of {what} is gone: exiting\n".encode())
        os._exit(1)

    thread = threading.Thread(target=watch, name="lifeline", daemon=True)
    thread.start()
    return thread

"""No process outlives what started it: a watched child exits when its parent dies."""

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time

from specbatch.lifeline import POLL_S

# A parent that starts a child (which watches it, or asks for the parent-death signal),
# prints the child's pid and then waits to be killed.
PARENT = textwrap.dedent(
    """
    import subprocess, sys, time
    from specbatch.lifeline import exit_with_parent_preexec
    watch = (
        "from specbatch.lifeline import exit_with_parent; exit_with_parent('t'); "
        "print('watching', flush=True); import time; time.sleep(60)"
    )
    sleep = "import time; time.sleep(60)"
    if sys.argv[1] == "watch":
        child = subprocess.Popen([sys.executable, "-c", watch], stdout=subprocess.PIPE, text=True)
        child.stdout.readline()
    else:
        child = subprocess.Popen([sys.executable, "-c", sleep], preexec_fn=exit_with_parent_preexec)
    print(child.pid, flush=True)
    time.sleep(60)
    """
)


def _child_outlives_its_parent(mode: str) -> bool:
    parent = subprocess.Popen([sys.executable, "-c", PARENT, mode], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    parent.kill()
    parent.wait()
    try:
        # not our child, so no waitpid: its /proc entry, for up to 20 of the watcher's polls
        for _ in range(200):
            if not os.path.exists(f"/proc/{child}") or _zombie(child):
                return False
            time.sleep(POLL_S / 10)
        return True
    finally:
        if os.path.exists(f"/proc/{child}"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_a_child_that_watches_its_parent_exits_when_the_parent_is_killed():
    assert not _child_outlives_its_parent("watch")


def test_a_child_started_with_the_parent_death_signal_exits_when_the_parent_is_killed():
    assert not _child_outlives_its_parent("pdeathsig")

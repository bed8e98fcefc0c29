"""When keep_freed_memory raises malloc's thresholds, and when it leaves them alone. Each
case runs in its own interpreter, since the thresholds are process-wide and the function
applies them once. What raising them buys a decoding engine is
tests/models/test_engine_host_memory.py."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from specbatch.decoding.host_memory import OPT_OUT_ENV, USER_MALLOC_SETTINGS

SETTINGS = (*USER_MALLOC_SETTINGS, OPT_OUT_ENV)
pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the thresholds are glibc's")

CALL = (
    "from specbatch.decoding.host_memory import keep_freed_memory\n"
    "print(keep_freed_memory(), keep_freed_memory())"
)


def _raised(**environment: str) -> str:
    inherited = {name: value for name, value in os.environ.items() if name not in SETTINGS}
    done = subprocess.run(
        [sys.executable, "-c", CALL],
        env={**inherited, **environment},
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return done.stdout.strip()


def test_raised_once_by_default() -> None:
    assert _raised() == "True True"


def test_a_users_own_malloc_setting_is_left_alone() -> None:
    assert _raised(MALLOC_TRIM_THRESHOLD_="131072") == "False False"
    assert _raised(GLIBC_TUNABLES="glibc.malloc.trim_threshold=131072") == "False False"


def test_the_opt_out_leaves_glibcs_defaults() -> None:
    assert _raised(SPECBATCH_KEEP_FREED_MEMORY="0") == "False False"

"""The process keeps freed tensor memory: a pass that reallocates the buffers the previous
one freed touches no new pages. Each case runs in its own interpreter, since malloc's
thresholds are process-wide and keep_freed_memory applies them once."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from specbatch.decoding.host_memory import OPT_OUT_ENV, USER_MALLOC_SETTINGS

SETTINGS = (*USER_MALLOC_SETTINGS, OPT_OUT_ENV)
pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the thresholds are glibc's")

PASSES = """
import resource, sys, torch
from specbatch.decoding.host_memory import keep_freed_memory
raised = keep_freed_memory() if sys.argv[1] == "keep" else None

def one_pass():
    # three 20 MiB buffers freed together: more free memory at the heap's top than
    # glibc's adapted trim threshold, as a decode step of a large batch frees
    buffers = [torch.empty(5 << 20).fill_(1.0) for _ in range(3)]
    del buffers

for _ in range(3):
    one_pass()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    one_pass()
print(raised, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 20)
"""


def _page_faults_per_pass(mode: str, **environment: str) -> tuple[str, float]:
    inherited = {name: value for name, value in os.environ.items() if name not in SETTINGS}
    done = subprocess.run(
        [sys.executable, "-c", PASSES, mode],
        env={**inherited, **environment},
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    raised, faults = done.stdout.split()
    return raised, float(faults)


def test_passes_reuse_freed_memory_once_kept() -> None:
    _, faults_by_default = _page_faults_per_pass("default")
    raised, faults_kept = _page_faults_per_pass("keep")
    assert faults_by_default >= 500  # the trap: each pass pages its buffers in again
    assert raised == "True"
    assert faults_kept <= 20


def test_a_users_own_malloc_setting_is_left_alone() -> None:
    raised, faults = _page_faults_per_pass("keep", MALLOC_TRIM_THRESHOLD_="131072")
    assert raised == "False"
    assert faults >= 500


def test_the_opt_out_leaves_glibcs_defaults() -> None:
    raised, faults = _page_faults_per_pass("keep", SPECBATCH_KEEP_FREED_MEMORY="0")
    assert raised == "False"
    assert faults >= 500

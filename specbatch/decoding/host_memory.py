"""Keeping freed tensor memory in the process instead of handing it back to the kernel.

A CPU decode step allocates and frees the same few large buffers (activations, logits,
gathered KV) every pass. glibc's malloc serves a block above its mmap threshold with a
fresh mmap and returns it with munmap when freed, and trims the top of its heap once the
free space there passes the trim threshold; either way the next pass touches new pages
and the kernel zero-fills each on a page fault. The thresholds adapt on their own, but
only up to 32 MiB and only after a large block was freed, so a batch whose buffers cross
that size, or whose sizes change from pass to pass, keeps faulting. On the 2-core VM of
docs/BENCHMARKS.md the a70 pair decoding 96 requests at 32 rows took 9.5-16.7 s with
0.4-4.9 million minor faults per run, and 8.7-9.5 s with 8-14 thousand once both
thresholds were raised ("Host memory" there, `scripts/bench_host_memory.py`); a whole
benchmark of four engines took 23 million faults and two identical engines in it read
0.80-1.21x of each other, 0.5 million and within 3 % with them.

Raising one threshold without the other is worse: fixing the trim threshold also stops
the mmap threshold adapting, so every block above 128 KiB is mmap'd (27 s a run in a
scratch run of the same engine).

The memory is kept per malloc arena, so the process keeps one arena for every thread. An
engine's loop thread ends when the engine is idle and the next submission starts a new
one; by default glibc gives it a free arena, often not its predecessor's (still exiting,
or another thread's), whose pages are faulted in again and then kept beside the others. Decoding
the same 32-row batch again on the 2-core VM with both cores busy elsewhere (three
repeats a run) paged in 6-10,342 pages with glibc's arenas (three runs), 5-1,039 with
one arena set as the models load (four runs), 5-15 with MALLOC_ARENA_MAX=1 from the
start (three runs). Threads started before the setting (the tokenizers') keep their
arenas, hence loading a pair calls this first.
The settings apply to the whole process; a user who tuned malloc through its environment
variables keeps their own, and `SPECBATCH_KEEP_FREED_MEMORY=0` leaves glibc's defaults
(the comparison above, or a host that must return memory at once).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
import platform

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
MMAP_THRESHOLD_BYTES = 32 << 20
"""The largest mmap threshold glibc accepts on 64-bit (half its heap size)."""
TRIM_THRESHOLD_BYTES = 1 << 30
"""Free memory at the top of the heap kept for the next pass before it is returned: a
bound on what the process holds beyond its live tensors."""
USER_MALLOC_SETTINGS = (
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_ARENA_MAX",
    "GLIBC_TUNABLES",
)
OPT_OUT_ENV = "SPECBATCH_KEEP_FREED_MEMORY"


@functools.cache
def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds for this process and keep one arena, once;
    True when they were set. Nothing is changed off glibc, where the user set malloc's own
    environment variables (theirs win), or where ``SPECBATCH_KEEP_FREED_MEMORY`` is ``0``."""
    if os.environ.get(OPT_OUT_ENV, "1") == "0":
        log.info("malloc thresholds left at glibc's defaults (%s=0)", OPT_OUT_ENV)
        return False
    chosen = [name for name in USER_MALLOC_SETTINGS if name in os.environ]
    if chosen:
        log.info("malloc thresholds left as %s set them", ", ".join(chosen))
        return False
    if platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    raised = all(
        libc.mallopt(option, value)
        for option, value in (
            (M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES),
            (M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES),
            (M_ARENA_MAX, 1),
        )
    )
    if raised:
        log.info(
            "malloc keeps up to %d MiB freed in one arena (mmap only above %d MiB)",
            TRIM_THRESHOLD_BYTES >> 20,
            MMAP_THRESHOLD_BYTES >> 20,
        )
    return raised

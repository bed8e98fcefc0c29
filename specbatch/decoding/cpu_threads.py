"""Giving a CPU instance's torch threads to the engine's loop, and to it alone.

PyTorch's CPU builds run their parallel operators on OpenMP, and every thread that runs
a parallel region with more than one thread keeps a team of worker threads for the rest
of its life. An instance loads its models on one thread and decodes on another (the
engine's loop). Were both to compute with several threads, the process would hold two
teams; with more OpenMP threads than cores, libgomp stops spin-waiting between parallel
regions, and every small matmul of a decode step pays for waking its workers. On the
2-core VM of docs/BENCHMARKS.md a small linear on a second thread took 162 µs after the
main thread had computed with two threads, against 47 µs after it had computed with one
(`scripts/bench_cpu_threads.py`, "Speculative decoding" there).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def threads_for_the_engine_loop(threads: int) -> Iterator[None]:
    """Run the body (loading the models, building the engine) on one torch thread, then
    set ``threads`` for the threads that compute afterwards. A thread takes torch's
    setting when it first computes, so the engine's loop, started by the first
    submission, runs on ``threads`` and the loading thread never forms a team."""
    if threads < 1:
        raise ValueError(f"cpu threads must be at least 1, got {threads}")
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)

"""The step functions as one compile mode runs them.

``none``: eager PyTorch, the reference and the CPU default. ``default``:
``torch.compile(fullgraph=True, dynamic=False)``, one graph per padded shape (a graph
break would mean a host synchronisation crept in, so it is an error, not a fallback).
``cuda_graphs``: the same with ``mode="reduce-overhead"``, so each shape is captured
once as a CUDA graph and replayed: a decode step becomes one launch instead of
hundreds, which is what keeps a small draft from being bound by kernel launches.
Weights and KV stores are marked as static addresses, so replays read them in place
(nothing is copied into the graph's input buffers) and the cache writes land in the
real store; outputs are cloned because a replay overwrites its previous outputs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from specbatch.decoding import step_functions

COMPILE_MODES = ("none", "default", "cuda_graphs")

# Graphs per step function: networks x batch buckets x widths x spans x sampling
# features. Dynamo's default limit (8 per function) would fail a fullgraph compile.
# Its configuration is per thread, so the limit is set around every call (the engine
# loop runs on its own thread).
RECOMPILE_LIMIT = 1024


def check_mode(mode: str, device: torch.device) -> None:
    if mode not in COMPILE_MODES:
        raise ValueError(f"compile must be one of {COMPILE_MODES}, got {mode!r}")
    if mode == "cuda_graphs" and device.type != "cuda":
        raise ValueError(f"compile='cuda_graphs' needs a CUDA device, got {device}")


class StepFunctions:
    """``prefill_chunk``, ``sample_step`` and ``verify_step`` under one compile mode."""

    def __init__(self, mode: str, device: torch.device) -> None:
        check_mode(mode, device)
        self.mode = mode
        self.prefill_chunk: Callable[..., None] = self._wrap(step_functions.prefill_chunk)
        self.sample_step: Callable[..., Any] = self._wrap(step_functions.sample_step)
        self.verify_step: Callable[..., Any] = self._wrap(step_functions.verify_step)

    def pin(self, tensors: Iterable[torch.Tensor]) -> None:
        """Tensors that keep their address for the runner's life (weights, KV stores)."""
        if self.mode == "cuda_graphs":
            for tensor in tensors:
                torch._dynamo.mark_static_address(tensor)

    def _wrap(self, function: Callable) -> Callable:
        if self.mode == "none":
            return function
        mode = "reduce-overhead" if self.mode == "cuda_graphs" else "default"
        compiled = torch.compile(function, mode=mode, fullgraph=True, dynamic=False)

        def call(*args: Any) -> Any:
            with torch._dynamo.config.patch(
                recompile_limit=RECOMPILE_LIMIT, accumulated_recompile_limit=RECOMPILE_LIMIT
            ):
                out = compiled(*args)
            if out is None or self.mode == "default":
                return out
            return tuple(tensor.clone() for tensor in out)  # a replay overwrites its outputs

        return call

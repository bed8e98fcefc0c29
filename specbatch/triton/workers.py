"""The scheduler's WorkerBackend over BLS: batches to qwen3_specdec, lengths back to the router.

qwen3_specdec is decoupled: for a batch it streams delta responses (text of streaming
rows, by row) and early answers (a row that finished), then one response with every
row's outcome and the instance's measurements. The backend's response iterator blocks while it waits, so a
daemon thread drains it into an asyncio queue: the dispatcher's loop stays free for
other batches, and a reply that never comes (the server shutting down) cannot keep the
stub process from exiting.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Sequence

import numpy as np

from specbatch.serving.dispatcher import BatchResult, DeltaSink, PromptJob, RowDone
from specbatch.serving.protocol import (
    batch_result_from_arrays,
    strings,
    work_arrays,
    worker_deltas_from_arrays,
    worker_row_done_from_arrays,
)
from specbatch.serving.tasks import SCORE
from specbatch.serving.worker import WorkItem
from specbatch.triton.tensors import bls_request, response_arrays

logger = logging.getLogger(__name__)

WORKER_OUTPUTS = (
    "text_output",
    "finish_reason",
    "error",
    "num_input_tokens",
    "num_output_tokens",
    "total_draft_tokens",
    "total_accepted_draft_tokens",
    "first_token_s",
    "seconds_per_token",
    "free_kv_tokens",
    "delta_row",
    "delta_text",
    "done_row",
)


async def _drain(replies) -> AsyncIterator:
    """Yield a blocking response iterator's items without blocking the event loop."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    def pump() -> None:
        try:
            for reply in replies:
                loop.call_soon_threadsafe(queue.put_nowait, reply)
            loop.call_soon_threadsafe(queue.put_nowait, done)
        except Exception as exc:
            loop.call_soon_threadsafe(queue.put_nowait, exc)

    threading.Thread(target=pump, name="specbatch-bls-replies", daemon=True).start()
    while (item := await queue.get()) is not done:
        if isinstance(item, Exception):
            raise item
        yield item


def work_items(jobs: Sequence[PromptJob]) -> list[WorkItem]:
    return [
        WorkItem(
            prompt=job.prepared.model_prompt,
            max_tokens=job.sampling.max_tokens,
            temperature=job.sampling.temperature,
            top_p=job.sampling.top_p,
            top_k=job.sampling.top_k,
            continuations=job.prepared.continuations,
            row_id=job.row_id,
            stream=job.on_delta is not None,
            chat=job.prepared.chat,
            stop=job.sampling.stop,
        )
        for job in jobs
    ]


class BlsWorkerBackend:
    """Runs dispatcher batches on the qwen3_specdec instances through async decoupled BLS."""

    def __init__(
        self,
        worker_model: str,
        generation_mode: str,
        router_model: str | None = None,
        observe_every: int = 64,
        observe_interval_s: float = 1.0,
    ) -> None:
        self._worker_model = worker_model
        self._generation_mode = generation_mode
        self._router_model = router_model
        self._observe_every = observe_every
        self._observe_interval_s = observe_interval_s
        self._observed: list[tuple[str, str, int]] = []
        self._last_observation_s = time.monotonic()
        self._background: set[asyncio.Task] = set()

    async def run(
        self, kind: str, jobs: Sequence[PromptJob], on_deltas: DeltaSink, on_row_done: RowDone
    ) -> BatchResult:
        mode = "score" if kind == SCORE else self._generation_mode
        request = bls_request(self._worker_model, work_arrays(mode, work_items(jobs)), WORKER_OUTPUTS)
        result = None
        async for reply in _drain(await request.async_exec(decoupled=True)):
            arrays = response_arrays(reply, WORKER_OUTPUTS)
            if "delta_row" in arrays:
                on_deltas(worker_deltas_from_arrays(arrays))
            elif "done_row" in arrays:
                on_row_done(*worker_row_done_from_arrays(arrays))
            elif "text_output" in arrays:
                result = batch_result_from_arrays(arrays)
        if result is None:
            raise RuntimeError(f"{self._worker_model} closed the stream without a final result")
        if kind != SCORE and self._router_model:
            self._observe(jobs, [o.num_output_tokens if not o.error else -1 for o in result.outcomes])
        return result

    def _observe(self, jobs: Sequence[PromptJob], output_tokens: list[int]) -> None:
        """Collect served lengths; report them to the router in batches (one BLS call each)."""
        self._observed += [
            (job.prepared.source, job.prepared.task, tokens)
            for job, tokens in zip(jobs, output_tokens, strict=True)
            if tokens >= 0
        ]
        now = time.monotonic()
        if (
            len(self._observed) < self._observe_every
            and now - self._last_observation_s < self._observe_interval_s
        ):
            return
        if not self._observed:
            return
        observed, self._observed, self._last_observation_s = self._observed, [], now
        arrays = {
            "text_input": strings([text for text, _, _ in observed]),
            "task": strings([task for _, task, _ in observed]),
            "observed_tokens": np.array([tokens for _, _, tokens in observed], dtype=np.int32),
        }
        task = asyncio.ensure_future(self._send_observation(arrays))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _send_observation(self, arrays) -> None:
        try:
            reply = await bls_request(self._router_model, arrays, ("routed_task",), batched=True).async_exec()
            response_arrays(reply, ("routed_task",))
        except Exception:
            logger.warning("could not report observed lengths to %s", self._router_model, exc_info=True)

"""qwen3_specdec: one target + draft pair on this instance's device, serving scheduler batches.

Called by the scheduler through BLS with a `mode` (speculative, target_only,
draft_only, score) and one row per prompt. Decoupled: streaming rows' text goes back
as one delta response per decode step, then a final response carries per-row outcomes
plus the instance's measured seconds per token and free KV capacity. execute() returns
only when its batch is done, so each instance runs one batch at a time.

With `max_batch_size` > 0 (configs/cpu_triton_batching.pbtxt) the model is called
directly and Triton's own dynamic batcher forms the batches: each request is one
prompt, and all requests of an execute() call run as one engine batch. That variant
exists to measure the custom scheduler against Triton's batcher.
"""

import json
import logging

import torch
import triton_python_backend_utils as pb_utils

from specbatch.decoding import Engine, load_model_pair
from specbatch.serving.cancellation import CancelBoard
from specbatch.serving.protocol import (
    work_from_arrays,
    worker_delta_arrays,
    worker_result_arrays,
    worker_row_done_arrays,
)
from specbatch.serving.settings import ModelSettings, project_root
from specbatch.serving.worker import BatchWorker, WorkerResult
from specbatch.triton import logs
from specbatch.triton.metrics import MetricRegistry
from specbatch.triton.tensors import arrays_of, error_response, response

INPUTS = (
    "mode", "prompt", "max_tokens", "temperature", "top_p", "top_k", "choices", "row_id", "stream",
    "stop", "chat", "enable_thinking", "chat_history", "assistant_prefix",
)
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
logger = logging.getLogger("specbatch.qwen3_specdec")


class TritonPythonModel:
    def initialize(self, args):
        logs.install()
        config = json.loads(args["model_config"])
        settings = ModelSettings(config, project_root(args["model_repository"]))
        if args["model_instance_kind"] == "GPU":
            device = f"cuda:{args['model_instance_device_id']}"
            torch.cuda.set_device(device)
        else:
            device = "cpu"
            torch.set_num_threads(settings.integer("cpu_threads", 1))
        self.instance = args["model_instance_name"]
        pair = load_model_pair(
            settings.model_path("target_model"),
            settings.model_path("draft_model"),
            device=device,
            dtype=settings.raw("dtype", "auto"),
        )
        self.engine = engine = Engine(
            pair,
            lookahead=settings.raw("lookahead", "goodput"),
            kv_memory_budget_bytes=int(settings.number("kv_memory_budget_gb") * (1 << 30)),
            block_size=settings.integer("kv_block_size", 16),
        )
        self.worker = BatchWorker(engine, CancelBoard.for_server())
        self.triton_batching = config.get("max_batch_size", 0) > 0
        self.metrics = MetricRegistry("qwen3_specdec")
        self.metrics.declare_counter(
            "specbatch_worker_errors_total", "Worker batches that failed", instance=self.instance
        )
        logger.info("%s ready on %s (free KV %d tokens)", self.instance, device, self.worker.free_kv_tokens)

    def execute(self, requests):
        if self.triton_batching:
            self._serve_triton_batch(requests)
            return None
        for request in requests:
            self._serve(request, request.get_response_sender())
        return None

    def _serve_triton_batch(self, requests):
        senders = [request.get_response_sender() for request in requests]
        answered = set()
        try:
            parsed = [work_from_arrays(arrays_of(request, INPUTS)) for request in requests]
            modes = {mode for mode, _ in parsed}
            if len(modes) != 1:
                raise ValueError(f"one batch cannot mix modes {sorted(modes)}")
            mode = modes.pop()

            def answer(row, outcome, first_token_s):
                answered.add(row)
                arrays = worker_result_arrays(WorkerResult([outcome], 0.0, 0, [first_token_s]))
                senders[row].send(response(arrays, batched=True), flags=FINAL)

            result = self.worker.run(
                mode, [item for _, items in parsed for item in items], on_row_done=answer
            )
        except Exception as exc:
            logger.exception("%s: batch failed", self.instance)
            for row, sender in enumerate(senders):
                if row not in answered:
                    sender.send(error_response(f"{self.instance}: {exc}"), flags=FINAL)
            return
        for row, sender in enumerate(senders):
            if row not in answered:
                sender.send(
                    response(worker_result_arrays(result.rows(row, row + 1)), batched=True), flags=FINAL
                )
        self._publish(mode, result)

    def _serve(self, request, sender):
        def send_deltas(deltas):
            sender.send(response(worker_delta_arrays(deltas)))

        def send_row_done(row, outcome, first_token_s):
            sender.send(response(worker_row_done_arrays(row, outcome, first_token_s)))

        try:
            mode, items = work_from_arrays(arrays_of(request, INPUTS))
            result = self.worker.run(mode, items, on_deltas=send_deltas, on_row_done=send_row_done)
        except Exception as exc:
            logger.exception("%s: batch failed", self.instance)
            self.metrics.increment(
                "specbatch_worker_errors_total", "Worker batches that failed", instance=self.instance
            )
            sender.send(error_response(f"{self.instance}: {exc}"), flags=FINAL)
            return
        sender.send(response(worker_result_arrays(result)), flags=FINAL)
        self._publish(mode, result)

    def _publish(self, mode, result):
        m, inst = self.metrics, self.instance
        m.increment("specbatch_worker_batches_total", "Batches served per mode", mode=mode, instance=inst)
        m.increment(
            "specbatch_worker_rows_total",
            "Prompts served per mode",
            len(result.outcomes),
            mode=mode,
            instance=inst,
        )
        drafted = sum(o.total_draft_tokens for o in result.outcomes)
        accepted = sum(o.total_accepted_draft_tokens for o in result.outcomes)
        m.increment("specbatch_draft_tokens_total", "Draft tokens proposed", drafted, instance=inst)
        m.increment("specbatch_accepted_draft_tokens_total", "Draft tokens accepted", accepted, instance=inst)
        m.set(
            "specbatch_free_kv_tokens",
            "KV tokens this instance can still hold",
            result.free_kv_tokens,
            instance=inst,
        )
        k = self.engine.snapshot().lookahead
        m.set("specbatch_lookahead", "Draft tokens per step (K) now", k, instance=inst)
        m.set(
            "specbatch_last_batch_rows",
            "Rows in this instance's last batch",
            len(result.outcomes),
            instance=inst,
        )

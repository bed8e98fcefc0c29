"""qwen3_specdec: one target + draft pair on this instance's device, one continuous engine.

Each instance connects to the scheduler of its tritonserver under its own name
(`specbatch.serving.instance`): the scheduler sends the rows it admitted to this
instance, and the instance streams back tokens, outcomes and its load. execute() is
only used when the model is called directly (configs/cpu_triton_batching.pbtxt:
Triton's dynamic batcher forms static batches, the baseline the scheduler is measured
against).
"""

import contextlib
import json
import logging

import torch

from specbatch.decoding import Engine, load_model_pair
from specbatch.decoding.cpu_threads import threads_for_the_engine_loop
from specbatch.lifeline import exit_with_parent
from specbatch.serving.faults import fault_hooks
from specbatch.serving.framing import socket_path
from specbatch.serving.instance.direct import INPUTS, direct_arrays, rows_from_arrays, run_rows
from specbatch.serving.instance.link import SchedulerLink
from specbatch.serving.instance.runner import InstanceRunner
from specbatch.serving.settings import ModelSettings, root_of_repository
from specbatch.triton import logs
from specbatch.triton.tensors import FINAL, arrays_of, error_response, response

logger = logging.getLogger("specbatch.qwen3_specdec")


class TritonPythonModel:
    def initialize(self, args):
        logs.install()
        exit_with_parent("the qwen3_specdec stub")  # tritonserver gone: nobody to answer
        config = json.loads(args["model_config"])
        settings = ModelSettings(config, root_of_repository(args["model_repository"]))
        if args["model_instance_kind"] == "GPU":
            self.device = f"cuda:{args['model_instance_device_id']}"
            torch.cuda.set_device(self.device)
            loading = contextlib.nullcontext()
        else:
            self.device = "cpu"
            loading = threads_for_the_engine_loop(settings.integer("cpu_threads", 1))
        self.name = args["model_instance_name"]
        with loading:
            self.engine = Engine(
                load_model_pair(
                    settings.model_path("target_model"),
                    settings.model_path("draft_model"),
                    device=self.device,
                    dtype=settings.raw("dtype", "auto"),
                ),
                lookahead=settings.raw("lookahead", "goodput"),
                kv_memory_budget_bytes=int(settings.number("kv_memory_budget_gb") * (1 << 30)),
                block_size=settings.integer("kv_block_size", 16),
                max_rows=settings.integer("max_rows", 64),
                compile=settings.raw("compile", "none"),
                prefix_caching=settings.switch("prefix_caching", True),
            )
        self.batched = config.get("max_batch_size", 0) > 0
        self.faults = fault_hooks()
        self.link = None
        if not self.batched:
            interval_s = settings.number("report_interval_ms", 20.0) / 1000.0
            self.runner = InstanceRunner(self.engine, self.name, self._send, interval_s, self.faults)
            self.drain_s = settings.number("drain_ms", 20000.0) / 1000.0
            self.link = SchedulerLink(
                socket_path(),
                lambda: self.runner.hello(self.device),
                self.runner.handle,
                self.runner.cancel_all,
            )
            self.link.start()
        logger.info("%s ready on %s (%d KV blocks)", self.name, self.device, self.engine.pool.num_blocks)

    def _send(self, message):
        self.link.send(message)

    def execute(self, requests):
        senders = [request.get_response_sender() for request in requests]
        rows, owners = [], []
        for index, (request, sender) in enumerate(zip(requests, senders, strict=True)):
            try:
                parsed = rows_from_arrays(arrays_of(request, INPUTS), len(rows))
            except (ValueError, KeyError, TypeError) as exc:
                sender.send(error_response(f"{self.name}: bad request: {exc}"), flags=FINAL)
                continue
            if not parsed:
                sender.send(error_response(f"{self.name}: bad request: no prompt"), flags=FINAL)
                continue
            rows += parsed
            owners += [index] * len(parsed)
        run_rows(
            lambda send: InstanceRunner(self.engine, self.name, send, faults=self.faults),
            rows,
            owners,
            lambda index, mine: senders[index].send(
                response(direct_arrays(mine), batched=self.batched), flags=FINAL
            ),
        )
        return None

    def finalize(self):
        if self.link is not None:
            if not self.runner.drain(self.drain_s):
                logger.warning(
                    "%s: rows still running after %.0f s; unloading anyway", self.name, self.drain_s
                )
            self.link.stop()

"""scheduler: the one place that holds requests across time (decoupled, one instance).

execute() only admits: graph prompts and per-prompt errors are answered at once,
mmlu and infobench prompts are queued; an asyncio loop in its own thread forms
batches with the multi-bin + dynamic policy and runs them on qwen3_specdec through
async BLS. Each request's response goes out when its last prompt is done.
"""

import asyncio
import json
import logging
import threading
import time

import triton_python_backend_utils as pb_utils

from specbatch.serving.dispatcher import Dispatcher
from specbatch.serving.intake import RequestIntake, RoutedRequest
from specbatch.serving.protocol import outcome_arrays, texts
from specbatch.serving.scheduler_setup import build_limits, build_policy, load_token_counter, worker_slots
from specbatch.serving.settings import ModelSettings, project_root
from specbatch.triton import logs
from specbatch.triton.metrics import MetricRegistry
from specbatch.triton.tensors import error_response, optional_array, required_array, response
from specbatch.triton.workers import BlsWorkerBackend

logger = logging.getLogger("specbatch.scheduler")
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def initialize(self, args):
        logs.install()
        config = json.loads(args["model_config"])
        settings = ModelSettings(config, project_root(args["model_repository"]))
        count_tokens, max_context = load_token_counter(settings.model_path("target_model"))
        self.intake = RequestIntake(build_limits(settings), count_tokens, max_context, time.monotonic)
        self.metrics = MetricRegistry("scheduler")
        backend = BlsWorkerBackend(
            settings.raw("worker_model", "qwen3_specdec"),
            settings.raw("generation_mode", "speculative"),
            router_model=settings.raw("router_model", "router"),
        )
        slots = worker_slots(settings)
        self.loop = asyncio.new_event_loop()
        self.dispatcher = Dispatcher(
            build_policy(settings, slots),
            backend,
            slots,
            score_batch_max=settings.integer("score_batch_max", 32),
            on_batch=self._publish_batch,
        )
        self.thread = threading.Thread(target=self._run_loop, name="specbatch-dispatch", daemon=True)
        self.thread.start()
        logger.info("scheduler ready: %d worker slots, context %d tokens", len(slots), max_context)

    def _run_loop(self):
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self.dispatcher.run())

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                routed = self._routed(request)
                jobs = self.intake.admit(routed, self._responder(sender, len(routed.prompts)))
            except ValueError as exc:
                sender.send(error_response(str(exc)), flags=FINAL)
                continue
            for job in jobs:
                self.loop.call_soon_threadsafe(self.dispatcher.submit, job)
        return None

    def _routed(self, request):
        def column(name):
            array = optional_array(request, name)
            return None if array is None else array.tolist()

        stream = optional_array(request, "stream")
        return RoutedRequest(
            prompts=required_array(request, "text_input").tolist(),
            tasks=texts(required_array(request, "routed_task")),
            predicted_tokens=required_array(request, "predicted_tokens").tolist(),
            route_errors=texts(required_array(request, "route_error")),
            max_tokens=column("max_tokens"),
            temperature=column("temperature"),
            top_p=column("top_p"),
            top_k=column("top_k"),
            stream=bool(stream is not None and stream.any()),
        )

    def _responder(self, sender, count):
        def respond(outcomes):
            for outcome in outcomes:
                self.metrics.increment(
                    "specbatch_prompts_total", "Prompts answered per task", task=outcome.task or "none"
                )
                if outcome.error:
                    self.metrics.increment(
                        "specbatch_prompt_errors_total",
                        "Prompts answered with an error",
                        task=outcome.task or "none",
                    )
            try:
                if count == 1 and outcomes[0].error:
                    sender.send(error_response(outcomes[0].error), flags=FINAL)
                else:
                    sender.send(response(outcome_arrays(outcomes)), flags=FINAL)
            except Exception:
                logger.exception("sending a response failed (client gone?)")

        return respond

    def _publish_batch(self, kind, size, snapshot):
        m = self.metrics
        m.increment("specbatch_batches_total", "Batches dispatched per kind", kind=kind)
        m.increment(
            "specbatch_batched_prompts_total", "Prompts dispatched in batches per kind", size, kind=kind
        )
        m.set("specbatch_batch_size", "Size of the last batch dispatched", size, kind=kind)
        for index, depth in enumerate(snapshot["queue_depth"]):
            m.set("specbatch_queue_depth", "Prompts waiting per length bin", depth, bin=str(index))
        m.set(
            "specbatch_queue_depth",
            "Prompts waiting per length bin",
            snapshot["score_queue_depth"],
            bin="score",
        )
        for worker, state in snapshot["workers"].items():
            for key in ("b_mem", "b_sla"):
                if state.get(key) is not None:
                    m.set(
                        f"specbatch_{key}",
                        f"Last {key} bound of the dynamic batcher",
                        state[key],
                        worker=worker,
                    )

    def finalize(self):
        self.loop.call_soon_threadsafe(self.dispatcher.stop)
        self.thread.join(timeout=30)

"""scheduler: the one place that holds requests across time (decoupled, one instance).

execute() only admits: graph prompts and per-prompt errors are answered at once,
mmlu and infobench prompts are queued; an asyncio loop in its own thread forms
batches with the multi-bin + dynamic policy, runs them on qwen3_specdec through
async BLS, forwards streamed text, watches for cancelled requests and publishes the
latency histograms. Each request's final response goes out when its last prompt is done.
"""

import asyncio
import json
import logging
import threading
import time

import triton_python_backend_utils as pb_utils

from specbatch.serving.cancellation import CancelBoard
from specbatch.serving.dispatcher import Dispatcher
from specbatch.serving.intake import RequestIntake, RoutedRequest
from specbatch.serving.pending import PendingRequests
from specbatch.serving.protocol import delta_arrays, outcome_arrays, texts
from specbatch.serving.scheduler_setup import (
    build_limits,
    build_policy,
    build_sla,
    load_token_counter,
    worker_slots,
)
from specbatch.serving.settings import ModelSettings, project_root
from specbatch.triton import logs
from specbatch.triton.metrics import MetricRegistry, declare_outcome_counters
from specbatch.triton.tensors import error_response, optional_array, required_array, response
from specbatch.triton.workers import BlsWorkerBackend

logger = logging.getLogger("specbatch.scheduler")
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
LATENCY_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0]
TPOT_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0]


class TritonPythonModel:
    def initialize(self, args):
        logs.install()
        config = json.loads(args["model_config"])
        settings = ModelSettings(config, project_root(args["model_repository"]))
        count_tokens, max_context, render_chat = load_token_counter(settings.model_path("target_model"))
        self.intake = RequestIntake(
            build_limits(settings), count_tokens, max_context, time.monotonic, render_chat
        )
        self.sla = build_sla(settings)
        self.cancel_poll_s = settings.number("cancel_poll_ms", 100.0) / 1000.0
        self.metrics = MetricRegistry("scheduler")
        declare_outcome_counters(self.metrics, self.sla)
        self.pending = PendingRequests()
        board = CancelBoard.for_server()
        board.reset()
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
            board=board,
        )
        self.thread = threading.Thread(target=self._run_loop, name="specbatch-dispatch", daemon=True)
        self.thread.start()
        logger.info("scheduler ready: %d worker slots, context %d tokens", len(slots), max_context)

    def _run_loop(self):
        asyncio.set_event_loop(self.loop)
        watcher = self.loop.create_task(self._watch_cancellations())
        self.loop.run_until_complete(self.dispatcher.run())
        watcher.cancel()
        self.loop.run_until_complete(asyncio.gather(watcher, return_exceptions=True))

    async def _watch_cancellations(self):
        while True:
            await asyncio.sleep(self.cancel_poll_s)
            for key in self.pending.cancelled():
                self.dispatcher.cancel(key)

    def execute(self, requests):
        """Read each request's tensors and hand it to the dispatcher's loop, which answers it.

        Only tensor reading happens on this thread; admission, responses, metrics and
        cancellation checks all run on the loop's thread.
        """
        for request in requests:
            sender = request.get_response_sender()
            try:
                routed = self._routed(request)
            except ValueError as exc:
                sender.send(error_response(str(exc)), flags=FINAL)
                continue
            self.loop.call_soon_threadsafe(self._admit, routed, request, sender)
        return None

    def _admit(self, routed, request, sender):
        reply = _Reply(self, sender, len(routed.prompts), routed.stream)
        try:
            jobs = self.intake.admit(routed, reply.complete, reply.delta if routed.stream else None)
        except ValueError as exc:
            sender.send(error_response(str(exc)), flags=FINAL)
            return
        if jobs:
            self.pending.add(
                jobs[0].key[0], [job.key for job in jobs], request.is_cancelled, lambda: reply.done
            )
        for job in jobs:
            self.dispatcher.submit(job)

    def _routed(self, request):
        def column(name):
            array = optional_array(request, name)
            return None if array is None else array.tolist()

        stream = optional_array(request, "stream")
        exclude_input = optional_array(request, "exclude_input_in_output")
        if exclude_input is not None and not exclude_input.all():
            raise ValueError("exclude_input_in_output=false is not supported: outputs never hold the prompt")
        timeout_us = request.timeout()
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
            timeout_s=timeout_us / 1e6 if timeout_us else None,
            chat=column("chat"),
            enable_thinking=column("enable_thinking"),
            chat_history=column("chat_history"),
            stop_words=column("stop_words"),
        )

    def publish_outcomes(self, outcomes, timings):
        m = self.metrics
        for outcome, timing in zip(outcomes, timings, strict=True):
            task = outcome.task or "none"
            m.increment(
                "specbatch_prompts_total",
                "Prompts answered per task and finish reason",
                task=task,
                finish_reason=outcome.finish_reason,
            )
            if outcome.error:
                m.increment("specbatch_prompt_errors_total", "Prompts answered with an error", task=task)
                continue
            m.observe(
                "specbatch_e2e_seconds",
                "End-to-end latency per prompt",
                timing.e2e_s,
                LATENCY_BUCKETS,
                task=task,
            )
            m.observe(
                "specbatch_queue_seconds",
                "Time from arrival to dispatch",
                timing.queue_s,
                LATENCY_BUCKETS,
                task=task,
            )
            if timing.ttft_s is not None:
                m.observe(
                    "specbatch_ttft_seconds", "Time to first token", timing.ttft_s, LATENCY_BUCKETS, task=task
                )
            if timing.tpot_s is not None:
                m.observe(
                    "specbatch_tpot_seconds",
                    "Time per output token after the first",
                    timing.tpot_s,
                    TPOT_BUCKETS,
                    task=task,
                )
            violations = self.sla.violations(timing)
            for bound in violations:
                m.increment(
                    "specbatch_sla_violations_total",
                    "Prompts that broke an SLA bound",
                    task=task,
                    bound=bound,
                )
            if not violations:
                m.increment(
                    "specbatch_goodput_prompts_total", "Prompts served within every SLA bound", task=task
                )

    def _publish_batch(self, kind, size, snapshot):
        m = self.metrics
        m.increment("specbatch_batches_total", "Batches dispatched per kind", kind=kind)
        m.increment(
            "specbatch_batched_prompts_total", "Prompts dispatched in batches per kind", size, kind=kind
        )
        m.set("specbatch_batch_size", "Size of the last batch dispatched", size, kind=kind)
        m.observe(
            "specbatch_batch_size_prompts",
            "Batch sizes dispatched",
            size,
            [1, 2, 4, 8, 16, 32, 64, 128],
            kind=kind,
        )
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


class _Reply:
    """One request's response sender: stream deltas, then exactly one final response."""

    def __init__(self, model, sender, count, stream):
        self.model, self.sender, self.count, self.stream = model, sender, count, stream
        self.done = False

    def delta(self, index, task, text):
        try:
            self.sender.send(response(delta_arrays(index, task, text), batched=True))
        except Exception:
            logger.warning("sending a stream delta failed (client gone?)", exc_info=True)

    def complete(self, outcomes, timings):
        self.done = True
        self.model.publish_outcomes(outcomes, timings)
        try:
            if all(o.finish_reason == "cancelled" for o in outcomes):
                self.sender.send(error_response(outcomes[0].error, cancelled=True), flags=FINAL)
            elif self.count == 1 and outcomes[0].error:
                self.sender.send(error_response(outcomes[0].error), flags=FINAL)
            else:
                self.sender.send(
                    response(outcome_arrays(outcomes, with_text=not self.stream), batched=True), flags=FINAL
                )
        except Exception:
            logger.exception("sending a response failed (client gone?)")

"""scheduler: the one place that holds requests across time (decoupled, one instance).

execute() only reads tensors and hands each request to the scheduler's loop
(`specbatch.serving.scheduler`), which admits it or refuses it at once, sends its
prompts to the qwen3_specdec instances connected to it, and answers it through its
response sender. No torch in this process.
"""

import json

from specbatch.lifeline import exit_with_parent
from specbatch.serving.faults import fault_hooks
from specbatch.serving.framing import socket_path
from specbatch.serving.params import RequestError
from specbatch.serving.scheduler.core import Overloaded, ShuttingDown
from specbatch.serving.scheduler.hub import InstanceHub
from specbatch.serving.scheduler.intake import CHAT_COLUMNS, SAMPLING_COLUMNS, RoutedRequest
from specbatch.serving.scheduler.loop import SchedulerLoop
from specbatch.serving.scheduler.setup import build_core, build_sla
from specbatch.serving.settings import ModelSettings, root_of_repository
from specbatch.triton import logs
from specbatch.triton.replies import TritonReply
from specbatch.triton.scheduler_metrics import SchedulerMetrics
from specbatch.triton.strings import texts
from specbatch.triton.tensors import FINAL, error_response, optional_array, required_array

COLUMNS = (
    *SAMPLING_COLUMNS,
    *CHAT_COLUMNS,
    "min_length",
    "stop_words",
    "stop_token_ids",
    "logit_bias_ids",
    "logit_bias_values",
    "self_refine",
)


class TritonPythonModel:
    def initialize(self, args):
        logs.install()
        exit_with_parent("the scheduler stub")  # tritonserver gone: nobody to answer
        settings = ModelSettings(
            json.loads(args["model_config"]), root_of_repository(args["model_repository"])
        )
        self.faults = fault_hooks()
        self.core, solver = build_core(settings, SchedulerMetrics(build_sla(settings)), self.faults)
        self.loop = SchedulerLoop(
            self.core,
            InstanceHub(self.core, socket_path()),
            solver,
            settings.number("cancel_poll_ms", 100.0) / 1000.0,
            settings.number("shutdown_drain_s", 20.0),
        )
        self.loop.start()

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                routed = _routed(request)
            except ValueError as exc:
                sender.send(error_response(str(exc)), flags=FINAL)
                continue
            except Exception as exc:
                sender.send(error_response(f"the scheduler could not read the request: {exc}"), flags=FINAL)
                continue
            reply = TritonReply(request, sender, routed.stream, self.faults)
            self.loop.call(self._submit, routed, reply, sender)
        return None

    def _submit(self, routed, reply, sender):
        try:
            self.core.submit(routed, reply)
        except RequestError as exc:
            sender.send(error_response(str(exc)), flags=FINAL)
        except (Overloaded, ShuttingDown) as exc:
            sender.send(error_response(str(exc), unavailable=True), flags=FINAL)
        except Exception as exc:
            sender.send(error_response(f"scheduler failed to admit the request: {exc}"), flags=FINAL)
            raise

    def finalize(self):
        self.loop.stop()


def _routed(request) -> RoutedRequest:
    columns = {}
    for name in COLUMNS:
        array = optional_array(request, name)
        columns[name] = None if array is None else array.tolist()
    stream = optional_array(request, "stream")
    exclude_input = optional_array(request, "exclude_input_in_output")
    if exclude_input is not None and not exclude_input.all():
        raise ValueError("exclude_input_in_output=false is not supported: outputs never hold the prompt")
    timeout_us = request.timeout()
    return RoutedRequest(
        prompts=required_array(request, "text_input").tolist(),
        tasks=texts(required_array(request, "routed_task")),
        route_errors=texts(required_array(request, "route_error")),
        stream=bool(stream is not None and stream.any()),
        timeout_s=timeout_us / 1e6 if timeout_us else None,
        **columns,
    )

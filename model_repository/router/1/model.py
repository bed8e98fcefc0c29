"""router: each prompt's task, or its own error (CPU, Triton dynamic batching).

Structure decides; a prompt that stays ambiguous is routed as "ambiguous" and the
scheduler has the draft model place it, so the router never waits on another model
and never imports torch.
"""

from specbatch.lifeline import exit_with_parent
from specbatch.serving.router.routing import PromptRouter
from specbatch.triton import logs
from specbatch.triton.metrics import MetricRegistry
from specbatch.triton.strings import strings
from specbatch.triton.tensors import error_response, one_batch_entry, optional_array, response


class TritonPythonModel:
    def initialize(self, args):
        logs.install()
        exit_with_parent("the router stub")  # tritonserver gone: nobody to answer
        self.router = PromptRouter()
        self.metrics = MetricRegistry("router")

    def execute(self, requests):
        """Every request Triton's dynamic batcher gathered, each answered on its own."""
        return [self._serve(request) for request in requests]

    def _serve(self, request):
        try:
            prompts = one_batch_entry(request, "text_input").tolist()
            overrides = optional_array(request, "task")
            routes = self.router.route(prompts, None if overrides is None else overrides.tolist())
        except ValueError as exc:
            return error_response(str(exc))
        for route in routes:
            self.metrics.increment(
                "specbatch_routed_prompts_total", "Prompts routed per task", task=route.task or "error"
            )
        return response(
            {
                "routed_task": strings([r.task for r in routes]),
                "route_error": strings([r.error for r in routes]),
            },
            batched=True,
        )

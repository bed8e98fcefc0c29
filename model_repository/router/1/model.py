"""router: each prompt's task and predicted output length (CPU, Triton dynamic batching).

Structure decides; the draft model, through BLS on qwen3_specdec, is asked only
about prompts that stay ambiguous. Requests carrying `observed_tokens` are the
scheduler reporting served lengths, which tune the length predictor.
"""

import json
import logging

import numpy as np

from specbatch.routing import LengthPredictor
from specbatch.serving.fallback import draft_fallback
from specbatch.serving.protocol import strings, texts, work_arrays
from specbatch.serving.router import PromptRouter
from specbatch.serving.settings import ModelSettings, project_root
from specbatch.serving.worker import WorkItem
from specbatch.triton import logs
from specbatch.triton.metrics import MetricRegistry
from specbatch.triton.tensors import (
    bls_request,
    error_response,
    optional_array,
    required_array,
    response,
    response_arrays,
)

logger = logging.getLogger("specbatch.router")


class TritonPythonModel:
    def initialize(self, args):
        logs.install()
        settings = ModelSettings(json.loads(args["model_config"]), project_root(args["model_repository"]))
        self.fallback_model = settings.raw("fallback_model", "qwen3_specdec")
        self.fallback_tokens = settings.integer("fallback_tokens", 4)
        fallback = draft_fallback(self._draft_generate) if self.fallback_model != "none" else None
        self.router = PromptRouter(LengthPredictor(), fallback)
        self.metrics = MetricRegistry("router")

    def _draft_generate(self, prompt):
        self.metrics.increment("specbatch_router_fallbacks_total", "Prompts classified by the draft model")
        arrays = work_arrays("draft_only", [WorkItem(prompt=prompt, max_tokens=self.fallback_tokens)])
        request = bls_request(self.fallback_model, arrays, ("text_output", "error"))
        for reply in request.exec(decoupled=True):
            outputs = response_arrays(reply, ("text_output", "error"))
            if "text_output" in outputs:
                return texts(outputs["text_output"])[0]
        raise RuntimeError(f"{self.fallback_model} gave no answer to the routing fallback")

    def execute(self, requests):
        """Every request Triton's dynamic batcher gathered, each answered on its own."""
        return [self._serve(request) for request in requests]

    def _observe(self, request, prompts, observed):
        tasks = required_array(request, "task")
        self.router.observe(prompts, texts(tasks), observed.tolist())
        return response(
            {
                "routed_task": tasks,
                "predicted_tokens": observed.astype(np.int32),
                "route_error": strings([""] * len(prompts)),
            },
            batched=True,
        )

    def _serve(self, request):
        try:
            prompts = required_array(request, "text_input").tolist()
            overrides = optional_array(request, "task")
            observed = optional_array(request, "observed_tokens")
            if observed is not None:
                return self._observe(request, prompts, observed)
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
                "predicted_tokens": np.array([r.predicted_tokens for r in routes], dtype=np.int32),
                "route_error": strings([r.error for r in routes]),
            },
            batched=True,
        )

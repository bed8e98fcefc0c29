"""Custom Prometheus metrics on Triton's :8002/metrics endpoint.

A pb_utils.Metric stops working once its MetricFamily is garbage-collected, so the
registry keeps every family alive for the model's lifetime and hands out one metric
per label set.
"""

from __future__ import annotations

import threading

import triton_python_backend_utils as pb_utils

from specbatch.routing import TASKS
from specbatch.serving.latency import SlaTargets


class MetricRegistry:
    """Lazily creates labelled counters, gauges and histograms; safe from several threads."""

    def __init__(self, model: str) -> None:
        self._model = model
        self._families: dict[str, object] = {}
        self._metrics: dict[tuple, object] = {}
        self._lock = threading.Lock()

    def _family(self, name: str, description: str, kind) -> object:
        family = self._families.get(name)
        if family is None:
            family = pb_utils.MetricFamily(name=name, description=description, kind=kind)
            self._families[name] = family
        return family

    def _metric(self, name: str, description: str, kind, labels: dict[str, str], buckets=None):
        key = (name, tuple(sorted(labels.items())))
        with self._lock:
            metric = self._metrics.get(key)
            if metric is None:
                family = self._family(name, description, kind)
                full_labels = {"model": self._model, **labels}
                metric = (
                    family.Metric(labels=full_labels, buckets=buckets)
                    if buckets
                    else family.Metric(full_labels)
                )
                self._metrics[key] = metric
        return metric

    def declare_counter(self, name: str, description: str, **labels: str) -> None:
        """Export a counter at 0 before its first event, so dashboards and rate() see it from the start."""
        self._metric(name, description, pb_utils.MetricFamily.COUNTER, labels)

    def increment(self, name: str, description: str, value: float = 1.0, **labels: str) -> None:
        if value:
            self._metric(name, description, pb_utils.MetricFamily.COUNTER, labels).increment(value)

    def set(self, name: str, description: str, value: float, **labels: str) -> None:
        self._metric(name, description, pb_utils.MetricFamily.GAUGE, labels).set(value)

    def observe(self, name: str, description: str, value: float, buckets: list[float], **labels: str) -> None:
        self._metric(name, description, pb_utils.MetricFamily.HISTOGRAM, labels, buckets).observe(value)


def declare_outcome_counters(registry: MetricRegistry, sla: SlaTargets) -> None:
    """The scheduler's per-task outcome counters at 0: errors, goodput, each SLA bound checked.

    They would otherwise appear only at their first event, leaving a dashboard panel or
    an autoscaler query without a series to read until then.
    """
    for task in TASKS:
        registry.declare_counter("specbatch_prompt_errors_total", "Prompts answered with an error", task=task)
        registry.declare_counter(
            "specbatch_goodput_prompts_total", "Prompts served within every SLA bound", task=task
        )
        for bound in ("ttft", "tpot", "e2e"):
            if getattr(sla, f"{bound}_s") is not None:
                registry.declare_counter(
                    "specbatch_sla_violations_total",
                    "Prompts that broke an SLA bound",
                    task=task,
                    bound=bound,
                )

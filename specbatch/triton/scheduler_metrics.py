"""The scheduler's Prometheus metrics, fed by the core's events."""

from __future__ import annotations

import time
from operator import attrgetter

from specbatch.routing import TASKS
from specbatch.routing.classify import AMBIGUOUS
from specbatch.scheduling.admission import InstanceCapacity
from specbatch.scheduling.load import STEP_BATCH_LABELS, InstanceLoad
from specbatch.serving.latency import PromptTiming, SlaTargets
from specbatch.serving.messages import RowOutcome
from specbatch.serving.scheduler.core import SchedulerEvents
from specbatch.triton.metrics import MetricRegistry, declare_outcome_counters

LATENCY_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0]
TPOT_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0]


GAUGE_INTERVAL_S = 0.5
LABELLED_TASKS = frozenset((*TASKS, AMBIGUOUS))


def task_label(task: str) -> str:
    """The `task` label of a prompt's metrics. A client calling the scheduler directly
    names any task it likes (refused as unknown), and every label set a metric is given
    lives as long as the server, so a string outside the known tasks is counted as
    "unknown" instead of growing the label sets with each new one."""
    if not task:
        return "none"
    return task if task in LABELLED_TASKS else "unknown"


# Totals an engine counts from its start, exported as counters per instance.
ENGINE_TOTALS = (
    ("prefix_hit_tokens", "specbatch_prefix_hit_tokens_total", "Prompt tokens found in the prefix cache"),
    ("prefix_miss_tokens", "specbatch_prefix_miss_tokens_total", "Prompt tokens computed (not cached)"),
    ("evictions", "specbatch_kv_evictions_total", "Cached KV blocks evicted to make room"),
    (
        "lookahead_cut_steps",
        "specbatch_lookahead_cut_for_kv_total",
        "Decode steps run plain although the policy chose K > 0, for lack of KV room for the lookahead",
    ),
    ("step_seconds_total", "specbatch_step_seconds_total", "Seconds in engine steps that committed tokens"),
    (
        "cycle_seconds_total",
        "specbatch_cycle_seconds_total",
        "Wall seconds between committing steps while rows ran (steps plus stalls between them)",
    ),
)


# Per-instance distributions the engine counts step by step (InstanceLoad attribute path,
# metric, label, label values, help): one counter per value, the histogram of a small
# discrete quantity (bucket i counts the steps with value i, labelled i where no label
# values are given), so rate() per label is the distribution now.
STEP_HISTOGRAMS = (
    (
        "lookahead_steps",
        "specbatch_lookahead_steps_total",
        "k",
        None,
        "Decode steps per K chosen (0 = plain)",
    ),
    (
        "tokens_per_row_step",
        "specbatch_row_step_tokens_total",
        "tokens",
        None,
        "Row-steps per tokens a row committed in one decode step",
    ),
    (
        "batch_steps.steps",
        "specbatch_batch_steps_total",
        "rows",
        STEP_BATCH_LABELS,
        "Decode steps that committed tokens, per batch size (rows up to the label)",
    ),
    (
        "batch_steps.row_steps",
        "specbatch_batch_row_steps_total",
        "rows",
        STEP_BATCH_LABELS,
        "Rows summed over those steps, per batch size",
    ),
    (
        "batch_steps.tokens",
        "specbatch_batch_tokens_total",
        "rows",
        STEP_BATCH_LABELS,
        "Tokens rows committed in those steps, per batch size",
    ),
    (
        "batch_steps.prefill_tokens",
        "specbatch_batch_prefill_tokens_total",
        "rows",
        STEP_BATCH_LABELS,
        "Prompt tokens prefilled (prompts and draft catch-up) in those steps' iterations, per batch size",
    ),
    (
        "batch_steps.seconds",
        "specbatch_batch_step_seconds_total",
        "rows",
        STEP_BATCH_LABELS,
        "Seconds of those steps' iterations, per batch size",
    ),
    (
        "batch_steps.decode_steps",
        "specbatch_batch_decode_steps_total",
        "rows",
        STEP_BATCH_LABELS,
        "Those steps that prefilled nothing, per batch size",
    ),
    (
        "batch_steps.decode_seconds",
        "specbatch_batch_decode_step_seconds_total",
        "rows",
        STEP_BATCH_LABELS,
        "Seconds of the steps that prefilled nothing, per batch size",
    ),
    (
        "batch_steps.decode_seconds_squared",
        "specbatch_batch_decode_step_seconds_squared_total",
        "rows",
        STEP_BATCH_LABELS,
        "Squared seconds of the steps that prefilled nothing, per batch size: with the two "
        "above, the spread of a step's time",
    ),
    (
        "batch_steps.context_slots",
        "specbatch_batch_context_slots_total",
        "rows",
        STEP_BATCH_LABELS,
        "KV slots those steps' attention read, each row padded to its step's longest context, per batch size",
    ),
)


class SchedulerMetrics(SchedulerEvents):
    """Counters on every event; gauges (instance load, queue depth) at most every half
    second per series, since loads arrive with every engine step and each update is a
    message to the server process."""

    def __init__(self, sla: SlaTargets) -> None:
        self._m = MetricRegistry("scheduler")
        self._sla = sla
        self._last_gauge: dict[str, float] = {}
        self._pending: dict[str, tuple[InstanceLoad, int, int | None]] = {}
        self._totals: dict[tuple[str, str], float] = {}  # (instance, field) -> total counted
        self._kv_blocks: dict[str, tuple[int, int]] = {}  # instance -> (blocks in use, blocks)
        self._published_counts: dict[tuple[str, str], tuple[int, ...]] = {}
        declare_outcome_counters(self._m, sla)
        for name, text in (
            ("specbatch_rejected_prompts_total", "Prompts refused at once because the queue was full"),
            ("specbatch_shed_prompts_total", "Queued prompts failed early: their deadline could not be met"),
            ("specbatch_requeued_prompts_total", "Prompts re-run after their instance failed"),
            ("specbatch_instance_failures_total", "Instances taken out of service (connection lost or hung)"),
            ("specbatch_instance_restarts_total", "Instances back in service after a failure"),
            ("specbatch_scheduler_restarts_total", "Times the scheduler loop failed and restarted"),
        ):
            self._m.declare_counter(name, text)

    def settled(self, outcomes: list[RowOutcome], timings: list[PromptTiming]) -> None:
        m = self._m
        for outcome, timing in zip(outcomes, timings, strict=True):
            task = task_label(outcome.task)
            if outcome.instance and outcome.total_draft_tokens:
                m.increment(
                    "specbatch_draft_tokens_total",
                    "Draft tokens proposed",
                    outcome.total_draft_tokens,
                    instance=outcome.instance,
                )
                m.increment(
                    "specbatch_accepted_draft_tokens_total",
                    "Draft tokens accepted",
                    outcome.total_accepted_draft_tokens,
                    instance=outcome.instance,
                )
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
            violations = self._sla.violations(timing)
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

    def rejected(self, prompts: int) -> None:
        self._m.increment(
            "specbatch_rejected_prompts_total", "Prompts refused at once because the queue was full", prompts
        )

    def shed(self, prompts: int) -> None:
        self._m.increment(
            "specbatch_shed_prompts_total",
            "Queued prompts failed early: their deadline could not be met",
            prompts,
        )

    def requeued(self, prompts: int) -> None:
        self._m.increment(
            "specbatch_requeued_prompts_total", "Prompts re-run after their instance failed", prompts
        )

    def admitted(self, instance: str, prompts: int) -> None:
        self._m.increment(
            "specbatch_admitted_prompts_total", "Prompts started per instance", prompts, instance=instance
        )

    def instance_lost(self, instance: str) -> None:
        self._last_gauge.pop(instance, None)
        self._pending.pop(instance, None)
        self._kv_blocks.pop(instance, None)
        for field, _, _ in ENGINE_TOTALS:  # its replacement's engine counts from 0
            self._totals.pop((instance, field), None)
        for field, *_ in STEP_HISTOGRAMS:
            self._published_counts.pop((instance, field), None)
        self._m.increment(
            "specbatch_instance_failures_total", "Instances taken out of service (connection lost or hung)"
        )
        self._m.set(
            "specbatch_instance_up", "1 while the instance is connected and serving", 0, instance=instance
        )

    def instance_restarted(self, instance: str) -> None:
        self._m.increment("specbatch_instance_restarts_total", "Instances back in service after a failure")

    def instances_serving(self, count: int) -> None:
        self._m.set("specbatch_instances_serving", "Instances connected and in service", count)

    def _due(self, series: str) -> bool:
        now = time.monotonic()
        if now - self._last_gauge.get(series, -GAUGE_INTERVAL_S) < GAUGE_INTERVAL_S:
            return False
        self._last_gauge[series] = now
        return True

    def restarted(self, error: str) -> None:
        self._m.increment(
            "specbatch_scheduler_restarts_total", "Times the scheduler loop failed and restarted"
        )

    def instance_load(self, instance: str, load: InstanceLoad, capacity: InstanceCapacity) -> None:
        """Kept as the instance's latest; published when its half second is up (here, or at
        the loop's next tick), so the last load before an instance goes quiet is not lost."""
        self._pending[instance] = (load, capacity)
        self._publish_due()

    def _publish_due(self) -> None:
        for instance in list(self._pending):
            if self._due(instance):
                self._publish(instance, *self._pending.pop(instance))

    def _publish(self, instance: str, load: InstanceLoad, capacity: InstanceCapacity) -> None:
        m = self._m
        self._kv_blocks[instance] = (load.blocks_total - load.blocks_free, load.blocks_total)
        in_use, total = (sum(counts) for counts in zip(*self._kv_blocks.values(), strict=True))
        # One figure per server, as a pod-level router (the Gateway API Inference Extension's
        # endpoint picker) reads vLLM's: the share of KV blocks in use (evictable ones are free).
        m.set(
            "specbatch_kv_cache_usage_perc",
            "Share of the server's KV blocks in use by rows, 0-1 (cached but unused blocks are free)",
            in_use / total if total else 0.0,
        )
        m.set("specbatch_instance_up", "1 while the instance is connected and serving", 1, instance=instance)
        m.set("specbatch_running_rows", "Rows an instance is decoding", load.running, instance=instance)
        m.set(
            "specbatch_waiting_rows",
            "Rows waiting inside an instance's engine",
            load.waiting,
            instance=instance,
        )
        m.set(
            "specbatch_free_kv_blocks", "Free KV blocks of an instance", load.blocks_free, instance=instance
        )
        m.set("specbatch_lookahead", "Draft tokens per step (K) now", load.lookahead, instance=instance)
        m.set(
            "specbatch_step_seconds",
            "Smoothed duration of an engine step",
            load.step_seconds,
            instance=instance,
        )
        m.set(
            "specbatch_preemptions",
            "Rows preempted for lack of KV blocks so far",
            load.preemptions,
            instance=instance,
        )
        m.set(
            "specbatch_cached_kv_blocks",
            "KV blocks named by the prefix cache (held or evictable)",
            load.cached_blocks,
            instance=instance,
        )
        m.set(
            "specbatch_evictable_kv_blocks",
            "Cached KV blocks no row holds: reusable on a hit, evicted for room (counted as free)",
            load.evictable_blocks,
            instance=instance,
        )
        for field, name, text in ENGINE_TOTALS:
            self._count_total(instance, field, name, text, getattr(load, field))
        m.set(
            "specbatch_rows_allowed",
            "Rows admission allows an instance: min(b_mem, b_SLA)",
            capacity.rows_allowed,
            instance=instance,
        )
        if capacity.b_sla is not None:
            m.set(
                "specbatch_b_sla",
                "b_SLA of an instance (per-token SLA feedback)",
                capacity.b_sla,
                instance=instance,
            )
        if capacity.pace_s is not None:
            m.set(
                "specbatch_b_sla_pace_seconds",
                "Seconds a token b_SLA holds an instance to: the SLA's allowance, or what its "
                "rows afford where one row alone runs slower than that",
                capacity.pace_s,
                instance=instance,
            )
        for field, name, label, values, text in STEP_HISTOGRAMS:
            counts = attrgetter(field)(load)
            previous = self._published_counts.get((instance, field), ())
            if any(now < before for now, before in zip(counts, previous, strict=False)):
                previous = ()  # a restarted engine counts from zero again
            first = (instance, field) not in self._published_counts
            for index, count in enumerate(counts):
                before = previous[index] if index < len(previous) else 0
                value = values[index] if values else str(index)
                if first:  # every label exported from the instance's first report, at 0
                    m.declare_counter(name, text, instance=instance, **{label: value})
                m.increment(name, text, count - before, instance=instance, **{label: value})
            self._published_counts[(instance, field)] = counts

    def _count_total(self, instance: str, field: str, name: str, text: str, total: float) -> None:
        """Add what an engine's total grew by since it was last counted (a total that went
        down is a new engine: all of it is new). An instance's first report exports the
        counter even at 0, so a dashboard's ratio of two counters has both from the start."""
        if (instance, field) not in self._totals:
            self._m.declare_counter(name, text, instance=instance)
        counted = self._totals.get((instance, field), 0)
        grown = total - counted if total >= counted else total
        self._totals[instance, field] = total
        self._m.increment(name, text, grown, instance=instance)

    def queue_depths(self, depths: list[int]) -> None:
        self._publish_due()
        if not self._due("queue"):
            return
        for index, depth in enumerate(depths):
            self._m.set("specbatch_queue_depth", "Prompts waiting per length bin", depth, bin=str(index))
        self._m.set("specbatch_queued_prompts", "Prompts waiting for admission, all bins", sum(depths))

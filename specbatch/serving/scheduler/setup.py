"""Build the scheduler's collaborators from its model configuration parameters."""

from __future__ import annotations

import time

from specbatch.routing import GraphSolverPool, GraphTimeoutError, SolverBusyError
from specbatch.routing.length import CUT_ROWS
from specbatch.scheduling.admission import UNBINNED, AdmissionConfig, AdmissionPolicy
from specbatch.serving.faults import FaultHooks
from specbatch.serving.latency import SlaTargets
from specbatch.serving.params import PromptError, ServingLimits
from specbatch.serving.scheduler.core import CoreSettings, SchedulerCore, SchedulerEvents, SolveGraph
from specbatch.serving.scheduler.intake import RequestIntake
from specbatch.serving.settings import ConfigError, ModelSettings
from specbatch.serving.target_text import TargetText


def build_limits(settings: ModelSettings) -> ServingLimits:
    return ServingLimits(
        max_tokens_cap=settings.integer("max_tokens_cap", 1024),
        default_max_tokens=settings.integer("default_max_tokens", 256),
        default_temperature=settings.number("default_temperature", 0.0),
    )


def build_sla(settings: ModelSettings) -> SlaTargets:
    """Latency bounds for the violation counters; 0 leaves a bound unchecked."""

    def bound(key: str) -> float | None:
        value = settings.number(key, 0.0)
        return value / 1000.0 if value > 0 else None

    return SlaTargets(ttft_s=bound("sla_ttft_ms"), tpot_s=bound("sla_tpot_ms"), e2e_s=bound("sla_e2e_ms"))


def optional_seconds(settings: ModelSettings, key: str) -> float | None:
    """A duration parameter in ms; None where it is 0 or unset."""
    value = settings.number(key, 0.0)
    return value / 1000.0 if value > 0 else None


def build_admission(settings: ModelSettings) -> AdmissionPolicy:
    """`admission`: `least_slack` (bins, SLA order, b_mem and b_SLA per instance),
    `multibin` (an idle instance runs one length bin's batch to completion: the papers'
    setting), `fcfs` (one queue in arrival order, start what fits now: what vLLM does)
    or `shortest_first` (the same queue ranked by predicted length, blind to SLAs).
    `b_mem`, `b_sla` and `deadline_shedding` (on by default) switch one part off.
    A prompt's SLA: its first token within `sla_ttft_ms`, its last within
    `sla_finish_base_ms` + its tokens x `sla_finish_per_token_ms` (0: `sla_ttft_ms` and
    `sla_tpot_ms`); b_SLA holds each instance's pace to what its running rows and a long
    prompt of the mix can afford of their finish budgets, but never to one tighter than
    the allowance, the tighter of `sla_tpot_ms` and `sla_finish_per_token_ms` a token
    (`b_sla_pace`: `slack_above_allowance`); where one row alone runs slower than the
    allowance, to what its running rows afford, a row that cannot make its own steered to
    end within `sla_late_budgets` of it, else twice (`allowance_in_reach`: that, else the
    allowance; `slack`: the rows' pace wherever one row runs, tighter than the allowance
    too; `allowance`: the allowance always, Algorithm 2 as written). A request is
    refused when it would start too late for its SLA, or (`keep_promises`) push a queued
    prompt that can still make its SLA past it; with `start_beside` (on), a prompt whose
    delay to the running rows (its prefill, and its steps at what one more row adds to a
    step) fits in their slack starts beside them past b_SLA's rows. Rows are priced at
    the slowest seconds a token an instance reported over its last `pace_window_steps`
    committing steps (1, the default: its pace now), and with `beside_slowdown` (off) a start
    beside them at how much slower than its counters' means the instance runs now.
    `placement`: `least_loaded`, or `length_affine` (each instance starts the prompts of
    its own range of predicted lengths, spilling over when their home cannot).
    `kv_reservation`: b_mem counts each row at its final size (`ends`, Algorithm 1) or
    the most the rows hold at once as they grow and leave at their predicted ends (`peak`)."""
    order = settings.raw("admission", "least_slack")
    smart = order not in UNBINNED
    sla = build_sla(settings)
    return AdmissionPolicy(
        AdmissionConfig(
            order=order,
            num_bins=settings.integer("num_bins", 4),
            queue_limit=settings.integer("queue_limit", 256),
            queue_min=settings.integer("queue_min", 8),
            queue_seconds=settings.number("queue_seconds", 2.0),
            ttft_sla_s=sla.ttft_s or 2.0,
            tpot_sla_s=sla.tpot_s or 0.1,
            starvation_s=settings.number("starvation_bound_ms", 10000.0) / 1000.0,
            max_rows=settings.integer("batch_size_max", 64),
            memory_aware=smart and settings.switch("b_mem", True),
            sla_aware=smart and settings.switch("b_sla", True),
            shed_deadlines=smart and settings.switch("deadline_shedding", True),
            b_sla_pace=settings.raw("b_sla_pace", "slack_above_allowance"),
            keep_promises=settings.switch("keep_promises", True),
            start_beside=settings.switch("start_beside", True),
            late_budgets=settings.number("sla_late_budgets", 1.5),
            placement=settings.raw("placement", "least_loaded"),
            pace_window_steps=settings.integer("pace_window_steps", 1),
            beside_slowdown=settings.switch("beside_slowdown", False),
            kv_reservation=settings.raw("kv_reservation", "ends"),
            eps_mem=settings.number("eps_mem", 0.05),
            max_predicted_tokens=float(settings.integer("max_tokens_cap", 1024)),
            prefix_affinity_rows=settings.integer("prefix_affinity_rows", 2) if smart else -1,
            flush_s=settings.number("multibin_flush_ms", 500.0) / 1000.0,
            finish_base_s=optional_seconds(settings, "sla_finish_base_ms"),
            finish_per_token_s=optional_seconds(settings, "sla_finish_per_token_ms"),
        )
    )


def build_core_settings(settings: ModelSettings) -> CoreSettings:
    """`generation_mode`, `fallback_tokens` (a draft routing answer's tokens),
    `instance_hang_ms`, and `length_cut_rows`: how the length predictor learns a row cut
    before its end (`lower_bounds`: as at least its length, where that is more than the
    prediction; `skipped`: not at all)."""
    cut_rows = settings.raw("length_cut_rows", "lower_bounds")
    if cut_rows not in CUT_ROWS:
        choices = ", ".join(CUT_ROWS)
        raise ConfigError(f"parameter 'length_cut_rows' must be one of {choices}, got {cut_rows!r}")
    return CoreSettings(
        generation_mode=settings.raw("generation_mode", "speculative"),
        fallback_tokens=settings.integer("fallback_tokens", 4),
        hang_after_s=settings.number("instance_hang_ms", 60000.0) / 1000.0,
        cut_rows=cut_rows,
    )


def graph_solver(pool: GraphSolverPool) -> SolveGraph:
    """Solve in the pool's worker processes, never on the scheduler's loop; a prompt
    over the time limit or the size limits fails alone, a full pool fails it as overload."""

    async def solve(text: str) -> str:
        try:
            return await pool.solve(text)
        except GraphTimeoutError as exc:
            raise PromptError(str(exc)) from None
        except ValueError as exc:
            raise PromptError(f"graph prompt: {exc}") from None
        except SolverBusyError as exc:
            raise PromptError(f"the server is overloaded: {exc}") from None

    return solve


def build_core(
    settings: ModelSettings, events: SchedulerEvents, faults: FaultHooks
) -> tuple[SchedulerCore, GraphSolverPool]:
    """The core, and the graph solver pool the scheduler's loop starts and closes."""
    intake = RequestIntake(
        build_limits(settings),
        TargetText.load(settings.model_path("target_model")),
        time.monotonic,
        stream_interval_s=settings.number("stream_interval_ms", 50.0) / 1000.0,
    )
    pool = GraphSolverPool(
        workers=settings.integer("graph_workers", 2),
        timeout_s=settings.number("graph_timeout_ms", 2000.0) / 1000.0,
    )
    core = SchedulerCore(
        intake,
        build_admission(settings),
        graph_solver(pool),
        settings=build_core_settings(settings),
        events=events,
        faults=faults,
    )
    return core, pool

"""Build the scheduler model's collaborators from its configuration parameters."""

from __future__ import annotations

from collections.abc import Callable

from specbatch.scheduling import PolicyConfig, SchedulingPolicy
from specbatch.serving.chat import ChatFormat, render_chat
from specbatch.serving.intake import ChatRenderer
from specbatch.serving.latency import SlaTargets
from specbatch.serving.params import ServingLimits
from specbatch.serving.settings import ConfigError, ModelSettings


def build_limits(settings: ModelSettings) -> ServingLimits:
    return ServingLimits(
        max_tokens_cap=settings.integer("max_tokens_cap", 1024),
        default_max_tokens=settings.integer("default_max_tokens", 256),
        default_temperature=settings.number("default_temperature", 0.0),
    )


def build_sla(settings: ModelSettings) -> SlaTargets:
    """Latency bounds for the violation counters; 0 leaves a bound unchecked.

    `sla_tpot_ms` is also D_SLA, the per-token target the b_SLA controller steers to.
    """

    def bound(key: str) -> float | None:
        value = settings.number(key, 0.0)
        return value / 1000.0 if value > 0 else None

    return SlaTargets(ttft_s=bound("sla_ttft_ms"), tpot_s=bound("sla_tpot_ms"), e2e_s=bound("sla_e2e_ms"))


def worker_slots(settings: ModelSettings) -> list[str]:
    """One slot per qwen3_specdec instance: at most one batch in flight on each."""
    count = settings.integer("worker_instances", 2)
    if count < 1:
        raise ConfigError(f"worker_instances must be >= 1, got {count}")
    return [f"worker{i}" for i in range(count)]


def build_policy(settings: ModelSettings, workers: list[str]) -> SchedulingPolicy:
    """The multi-bin + dynamic policy; `fixed_batch_size` > 0 turns it into static B."""
    fixed = settings.integer("fixed_batch_size", 0)
    sla_ms = settings.number("sla_tpot_ms", 0.0)
    flush_ms = settings.number("flush_window_ms", 20.0)
    config = PolicyConfig(
        num_bins=settings.integer("num_bins", 4),
        boundaries=settings.raw("boundaries", "equal_mass"),
        max_len=float(settings.integer("max_tokens_cap", 1024)),
        bin_selection=settings.raw("bin_selection", "oldest_head"),
        starvation_bound_s=settings.number("starvation_bound_ms", 2000.0) / 1000.0,
        flush_window_s=flush_ms / 1000.0,
        fixed_batch_size=fixed or None,
        dynamic=not fixed,
        b_min=1,
        b_max=settings.integer("batch_size_max", 16),
        eps_mem=settings.number("eps_mem", 0.05),
        d_sla_s=sla_ms / 1000.0 if sla_ms > 0 else None,
        boundary_min_samples=settings.integer("boundary_min_samples", 50),
        boundary_refresh_every=settings.integer("boundary_refresh_every", 50),
    )
    return SchedulingPolicy(config, workers)


def load_token_counter(model_path: str) -> tuple[Callable[[str], int], int, ChatRenderer]:
    """The target tokenizer's token count, the target's context length, and its chat rendering."""
    from transformers import AutoConfig, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    max_context = int(AutoConfig.from_pretrained(model_path).max_position_embeddings)

    def count_tokens(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    def render(content: str, chat: ChatFormat) -> str:
        return render_chat(tokenizer, content, chat)

    return count_tokens, max_context, render

"""Per-request latency figures from the instants a streamed generation was observed.

TTFT is the wait for the first text delta, TPOT the mean gap between the tokens after
it, end-to-end the whole request. A server that sends no deltas (one final response,
the non-streaming protocol) gives no first-token instant: TTFT then falls back to the
end-to-end time and TPOT to end-to-end / tokens, both upper bounds of the true figures,
so targets met on the fallback still hold once deltas arrive.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LatencyFigures:
    e2e_ms: float
    ttft_ms: float
    tpot_ms: float | None
    streamed: bool


def latency_figures(
    start: float, first_delta: float | None, end: float, output_tokens: int
) -> LatencyFigures:
    """Figures in milliseconds from monotonic instants in seconds; TPOT is None when undefined."""
    if end < start or (first_delta is not None and not start <= first_delta <= end):
        raise ValueError(f"instants out of order: start={start}, first_delta={first_delta}, end={end}")
    if output_tokens < 0:
        raise ValueError(f"output_tokens must be >= 0, got {output_tokens}")
    e2e_ms = (end - start) * 1000.0
    if first_delta is None:
        tpot_ms = e2e_ms / output_tokens if output_tokens >= 1 else None
        return LatencyFigures(e2e_ms=e2e_ms, ttft_ms=e2e_ms, tpot_ms=tpot_ms, streamed=False)
    tpot_ms = (end - first_delta) * 1000.0 / (output_tokens - 1) if output_tokens >= 2 else None
    return LatencyFigures(
        e2e_ms=e2e_ms, ttft_ms=(first_delta - start) * 1000.0, tpot_ms=tpot_ms, streamed=True
    )

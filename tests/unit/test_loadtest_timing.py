"""TTFT, TPOT and end-to-end from the instants of a streamed request, and the no-delta fallback."""

from __future__ import annotations

import pytest

from specbatch.loadtest.timing import latency_figures


def test_streamed_request_gives_ttft_from_first_delta_and_tpot_over_the_rest():
    figures = latency_figures(start=10.0, first_delta=10.25, end=11.25, output_tokens=11)

    assert figures.streamed
    assert figures.e2e_ms == pytest.approx(1250.0)
    assert figures.ttft_ms == pytest.approx(250.0)
    assert figures.tpot_ms == pytest.approx(100.0)


def test_single_token_stream_has_no_tpot():
    figures = latency_figures(start=0.0, first_delta=0.1, end=0.2, output_tokens=1)

    assert figures.tpot_ms is None
    assert figures.ttft_ms == pytest.approx(100.0)


def test_without_deltas_ttft_falls_back_to_end_to_end_and_tpot_to_end_to_end_per_token():
    figures = latency_figures(start=1.0, first_delta=None, end=1.5, output_tokens=20)

    assert not figures.streamed
    assert figures.ttft_ms == pytest.approx(500.0) == figures.e2e_ms
    assert figures.tpot_ms == pytest.approx(25.0)


def test_without_deltas_or_tokens_there_is_no_tpot():
    assert latency_figures(start=0.0, first_delta=None, end=0.01, output_tokens=0).tpot_ms is None


@pytest.mark.parametrize(
    ("start", "first", "end", "tokens"),
    [(1.0, None, 0.5, 3), (1.0, 0.9, 2.0, 3), (1.0, 2.5, 2.0, 3), (0.0, None, 1.0, -1)],
)
def test_instants_out_of_order_are_refused(start, first, end, tokens):
    with pytest.raises(ValueError):
        latency_figures(start=start, first_delta=first, end=end, output_tokens=tokens)

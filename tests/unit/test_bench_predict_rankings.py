"""bench_predict's rankings: the full order per cell, and the pairs of set-ups the run decides."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from bench_predict import rankings


def row(setup: str, measured: float, predicted: float, load: float = 1.0) -> dict:
    return {
        "workload": "infobench",
        "phase": "load",
        "load": load,
        "setup": setup,
        "measured_goodput_rps": measured,
        "predicted_goodput_rps": predicted,
    }


def test_only_pairs_more_than_the_tolerance_apart_are_decided_and_counted_when_ordered_the_same():
    # a and b 5 % apart (undecided, and swapped); c 50 % below both (decided, ordered right
    # against a, wrong against b)
    (cell,) = rankings([row("a", 10.0, 9.0), row("b", 9.5, 9.6), row("c", 6.0, 9.3)])
    assert cell["measured"] == ["a", "b", "c"]
    assert cell["predicted"] == ["b", "c", "a"]
    assert not cell["same"]
    assert (cell["decided_pairs"], cell["decided_same"]) == (2, 1)


def test_cells_are_ranked_apart():
    light = [row("a", 10.0, 10.0), row("b", 5.0, 4.0)]
    heavy = [row("a", 3.0, 3.0, load=2.0), row("b", 4.0, 5.0, load=2.0)]
    cells = rankings(light + heavy)
    assert [(c["load"], c["same"], c["decided_pairs"], c["decided_same"]) for c in cells] == [
        (1.0, True, 1, 1),
        (2.0, True, 1, 1),
    ]

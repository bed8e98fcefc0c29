"""bench_predict's rankings: the full order per cell, and the pairs of set-ups the run decides."""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from bench_predict import medians_over_rounds, medians_table, rankings


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


def test_rounds_of_one_cell_are_ranked_apart():
    first = [row("a", 10.0, 10.0) | {"round": 0}, row("b", 5.0, 4.0) | {"round": 0}]
    second = [row("a", 4.0, 9.0) | {"round": 1}, row("b", 6.0, 5.0) | {"round": 1}]
    cells = rankings(first + second)
    assert [(c["round"], c["measured"], c["same"]) for c in cells] == [
        (0, ["a", "b"], True),
        (1, ["b", "a"], False),
    ]


def test_medians_over_rounds_compare_the_median_prediction_with_the_median_measurement():
    rounds = [(10.0, 12.0), (6.0, 6.3), (8.0, 9.0)]
    rows = [row("a", m, p) | {"label": "(a)", "round": r} for r, (m, p) in enumerate(rounds)]
    rows.append(row("b", 3.0, 2.0) | {"label": "(b)"})
    medians = {m["label"]: m for m in medians_over_rounds(rows)}
    assert medians["(a)"]["rounds"] == 3
    assert (medians["(a)"]["measured_goodput_rps"], medians["(a)"]["predicted_goodput_rps"]) == (8.0, 9.0)
    assert math.isclose(medians["(a)"]["goodput_error"], 9.0 / 8.0 - 1)
    assert medians["(b)"]["rounds"] == 1
    table = medians_table(list(medians.values()))
    assert "| infobench | (a) | 1× | 3 | 8.00 | 9.00 | +12% |" in table
    assert "1 of 2 cells" in table
    assert medians_table([medians["(b)"]]) == ""

"""What bench_policies reads of the instances' engine counters: the totals summed over
instances, the steps per K run and the steps cut to plain for KV room, as a run's
growth of them."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from bench_policies import engine_metrics, steps_by_k

METRICS = """\
# HELP specbatch_lookahead_steps_total Decode steps per K chosen (0 = plain)
# TYPE specbatch_lookahead_steps_total counter
specbatch_lookahead_steps_total{{instance="0",k="0"}} {plain0}
specbatch_lookahead_steps_total{{instance="0",k="4"}} 7
specbatch_lookahead_steps_total{{instance="1",k="0"}} 5
specbatch_lookahead_steps_total{{instance="1",k="8"}} 0
specbatch_lookahead_cut_for_kv_total{{instance="0"}} {cut0}
specbatch_lookahead_cut_for_kv_total{{instance="1"}} 1
specbatch_row_step_tokens_total{{instance="0",tokens="1"}} 10
specbatch_row_step_tokens_total{{instance="0",tokens="3"}} 2
"""


def read(tmp_path: Path, name: str, plain0: int, cut0: int) -> dict[str, float]:
    path = tmp_path / name
    path.write_text(METRICS.format(plain0=plain0, cut0=cut0))
    return engine_metrics(path.as_uri())


def test_steps_per_k_and_cut_steps_are_summed_over_instances_and_diffed(tmp_path: Path) -> None:
    before = read(tmp_path, "before", plain0=3, cut0=0)
    after = read(tmp_path, "after", plain0=13, cut0=4)
    assert after["specbatch_lookahead_steps_total"] == 13 + 7 + 5
    assert after["specbatch_lookahead_cut_for_kv_total"] == 5
    assert after["row_tokens"] == 10 * 1 + 2 * 3
    delta = {key: after[key] - before.get(key, 0.0) for key in after}
    assert steps_by_k(delta) == {"0": 10}  # of the steps per K, only instance 0's plain ones grew
    assert delta["specbatch_lookahead_cut_for_kv_total"] == 4
    assert steps_by_k({"steps_by_k|10": 2.0, "steps_by_k|4": 7.0, "steps_by_k|0": 0.0}) == {"4": 7, "10": 2}

"""The step simulator against the live server: bench_policies' rows, predicted.

For every row bench_policies measured of a continuous-batching set-up ((a) and its
ablations, (b), (d), and (a)'s prompt-heavy overload), the step-level simulator
(`specbatch.scheduling.simulate.continuous`) runs the same arrivals (rebuilt from the
run's seed and rates) through the `AdmissionPolicy` the server built from the same
parameters (the scheduler's cpu config and the set-up's SPECBATCH_* overrides, by the
server's own `build_admission`), with prompts prepared and their lengths predicted by the
server's own code, on two simulated instances whose KV room is the engine's.

Each row is predicted twice, from two readings of what a step costs:

- **Read from the live instances** (the prediction of record): the served instances count
  their committing steps per batch size (1, 2, 3-4, ... rows: steps, row-steps, the
  tokens rows committed, the prompt tokens prefilled beside them and the seconds; the
  `specbatch_batch_*` counters, bench_policies' `engine["by_batch"]`; a run from before
  those counters is read as one bucket from its totals). One non-negative least-squares
  fit over every bucket of every simulated row of the run prices a step as base + per
  row + per committed token + per prefilled token + per KV slot its attention read (the
  `specbatch_batch_context_slots_total` counter: rows x each step's longest context, as
  attention pads every row to it; one long row makes a step of short ones several times
  dearer); a row is then simulated at its own
  tokens per row-step at each batch size (what the goodput-chosen K made of speculation
  there) and at its own machine speed (its step seconds over what the fit charges for
  its steps, as the VM's speed moves from minute to minute). A table of the buckets over
  all rows, measured against fitted, shows where a straight line misses the step's shape.
- **Fitted offline** (the earlier method, kept as the comparison): the same model pair,
  engine and settings as the served instances (`qwen3_specdec`'s cpu config) timed on
  closed batches of 1-16 rows of infobench prompts; step seconds = base + per row x
  rows, prefill seconds per prompt token from the first steps, the tokens a row commits
  per step at each batch size under the goodput-chosen K, scaled to the row's machine
  speed. A fresh engine's K policy at a closed batch is not the served one's under a
  stream of arrivals: at 1-4 rows it decoded plain where the served instances committed
  1.1-2.1 tokens a row-step.

Each prompt's length is predicted as the scheduler predicts it: as it arrives, by a length
predictor that has learned from the rows the simulated run served before it (a row cut at
its max_tokens as a lower bound), as the server's does over a live run; `--lengths fixed`
predicts every prompt once, before the run, with a predictor that has learned nothing.
Each row runs as long as the served model makes it (greedy: to its end of sequence, or
its max_tokens).

A live scheduler and router carry what they learned from one phase to the next:
bench_policies serves each set-up's cells of a workload on one server (a warm-up, then its
loads in ascending order, round by round, the prompt-heavy overload after them), and the
length predictor's corrections, the memory margin's running error and the instances'
paces a cell starts from are those the cells before it left. So each row is simulated
after the warm-up and its set-up's earlier cells, on the same virtual clock, through the
same policy and length predictor, each phase a drain (--drain) after the one before it,
and only the row's own requests are measured; `--history fresh` starts every row from a
fresh scheduler instead.

Steps on the served instances are not as regular as their costs, and a row near the end
of its SLA's pace misses it in a run of slow steps. The instances also count the squared
seconds of the steps that prefilled nothing, per batch size; with `--step-cv measured`
each row's simulated steps are drawn around their cost (lognormal, seeded) at the
coefficient of variation its instances measured (a row from before those counters at
exact costs), and `--step-cv X` draws every row's at X. The default is exact costs: on
the runs measured so far the drawn steps did not predict better overall
(docs/BENCHMARKS.md, "The step simulator against the live server").

Nothing is fitted to the served results' goodput or latency.

Left out, and said so in the output: (c) (Triton's static batcher is not a continuous
policy) and the `mixed` workload (graph prompts are solved by the router's solver and
mmlu prompts scored, which the simulator does not model).

    .venv/bin/python scripts/bench_predict.py --policies results/bench_policies.json
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import json
import logging
import math
import re
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_policies import (  # noqa: E402
    SETUPS,
    e2e_sla_s,
    meets_sla,
    server_env,
    warm_up_arrivals,
    workloads,
)

from specbatch.figures import save_figure  # noqa: E402
from specbatch.routing.length import LengthPredictor  # noqa: E402
from specbatch.scheduling.admission import AdmissionPolicy  # noqa: E402
from specbatch.scheduling.load import STEP_BATCH_LABELS, decode_step_cv  # noqa: E402
from specbatch.scheduling.simulate.continuous import (  # noqa: E402
    ContinuousSimulator,
    SimInstance,
    SimOutcome,
    SimRequest,
    StepCosts,
)
from specbatch.serving.scheduler.setup import build_admission, build_core_settings  # noqa: E402
from specbatch.serving.scheduler.tasks import PreparedPrompt, prepare_prompt  # noqa: E402
from specbatch.serving.settings import ModelSettings  # noqa: E402
from specbatch.serving.target_text import TargetText  # noqa: E402

if TYPE_CHECKING:
    from specbatch.decoding.pair import ModelPair

logger = logging.getLogger("bench_predict")
REPOSITORY = ROOT / "model_repository"
SIMULATED = ("infobench", "heavy", "memory")
FIT_ROWS = (1, 2, 4, 8, 16)
TOLERANCE = 0.15  # the bound on the goodput error
LEARN_ROWS = 64  # prompts decoded together to learn their ends (greedy: the batch changes no output)
# the figures of a row's decode steps (those that prefilled nothing) its spread is read from
DECODE_SPREAD = ("decode_steps", "decode_seconds", "decode_seconds_squared")


def config_parameters(path: Path) -> dict:
    """A config.pbtxt's parameters, as Triton hands them to a Python model."""
    pairs = re.findall(r'key: "([a-z0-9_]+)" value: \{ string_value: "([^"]*)" \}', path.read_text())
    return {"name": path.parent.name, "parameters": {k: {"string_value": v} for k, v in pairs}}


def bench_args(config: dict) -> argparse.Namespace:
    """bench_policies' arguments back from the strings its JSON keeps."""
    values = {}
    for key, text in config.items():
        try:
            values[key] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            values[key] = text
    return argparse.Namespace(**values)


def instance_settings() -> ModelSettings:
    return ModelSettings(
        config_parameters(REPOSITORY / "qwen3_specdec" / "configs" / "cpu.pbtxt"), ROOT, env={}
    )


@functools.cache
def served_pair() -> ModelPair:
    """The model pair the served instances load (their cpu config), loaded once."""
    from specbatch.decoding import load_model_pair

    settings = instance_settings()
    return load_model_pair(
        settings.model_path("target_model"), settings.model_path("draft_model"), device="cpu", dtype="float32"
    )


def fit_costs(steps: int) -> tuple[StepCosts, int, dict]:
    """The served instance's engine, built as its cpu config builds it, timed on closed
    batches: (step costs, KV tokens per GB of budget, the fit's raw points)."""
    import torch

    from specbatch.decoding import Engine, GenerationRequest
    from specbatch.routing import build_infobench_prompt, generate_workload

    settings = instance_settings()
    torch.set_num_threads(settings.integer("cpu_threads", 1))
    pair = served_pair()
    budget_gb = settings.number("kv_memory_budget_gb")
    engine = Engine(
        pair,
        lookahead=settings.raw("lookahead", "goodput"),
        kv_memory_budget_bytes=int(budget_gb * (1 << 30)),
        block_size=settings.integer("kv_block_size", 16),
        max_rows=settings.integer("max_rows", 64),
        prefix_caching=False,  # a fit from cache hits would under-charge prefill
    )
    texts = [build_infobench_prompt(p.text) for p in generate_workload(64, 7, mix={"infobench": 1.0})]
    engine.generate([GenerationRequest(texts[0], max_new_tokens=8)])  # warm
    decode, prefill, tokens = [], [], {}
    for rows in FIT_ROWS:
        batch = [GenerationRequest(texts[(rows + i) % len(texts)], max_new_tokens=steps) for i in range(rows)]
        first_s, steps_s, committed = timed_steps(engine, batch)
        full = list(zip(steps_s, committed, strict=True))[: max(1, len(steps_s) // 2)]  # every row still runs
        decode += [(rows, seconds) for seconds, _ in full]
        tokens[rows] = statistics.mean(n for _, n in full) / rows
        median_s = statistics.median(seconds for seconds, _ in full)
        prefill.append((sum(len(pair.tokenizer.encode(r.prompt)) for r in batch), first_s - median_s))
        logger.info(
            "fit: %d rows, %.1f ms a step, %.2f tokens a row-step", rows, 1000 * median_s, tokens[rows]
        )
    x = np.array([[1.0, r] for r, _ in decode])
    (base, per_row), *_ = np.linalg.lstsq(x, np.array([d for _, d in decode]), rcond=None)
    per_prompt_token = max(0.0, sum(s for _, s in prefill) / sum(t for t, _ in prefill))
    costs = StepCosts(
        base_s=max(float(base), 1e-6),
        per_row_s=max(float(per_row), 0.0),
        per_prefill_token_s=per_prompt_token,
        tokens_per_row_step=tuple(sorted(tokens.items())),
    )
    load = engine.snapshot()
    kv_tokens_per_gb = load.blocks_total * load.block_size / budget_gb
    return costs, int(kv_tokens_per_gb), {"decode": decode, "prefill": prefill, "tokens": tokens}


def timed_steps(engine, batch: list) -> tuple[float, list[float], list[int]]:
    """One closed batch through the engine: the first step's seconds (prefill included),
    then each later step's seconds and the tokens it committed."""
    marks: list[tuple[float, int]] = []

    def on_step(new: dict[int, list[int]]) -> None:
        marks.append((time.perf_counter(), sum(len(ids) for ids in new.values())))

    started = time.perf_counter()
    engine.generate(batch, on_step=on_step)
    durations = np.diff([started] + [at for at, _ in marks]).tolist()
    return durations[0], durations[1:], [n for _, n in marks[1:]]


class Requests:
    """bench_policies' arrivals as the scheduler queues them: prepared, counted and
    predicted by the server's own code, and as long as the served model makes them.
    Greedy decoding is deterministic and speculation keeps the target's greedy output,
    so each prompt ends where the target, decoding it greedily alone, reaches its end of
    sequence, or at its max_tokens if sooner: an arrival charged all of its max_tokens
    would cost the simulated instances tokens the served ones never decode (on
    `infobench` the served rows committed about 84 % of what the arrivals asked)."""

    def __init__(self) -> None:
        self._text = TargetText.load(str(ROOT / ".models" / "tiny" / "target"))
        self._predictor = LengthPredictor()
        self._ends: dict[str, int | None] = {}  # model text -> tokens before its end of sequence

    def _prepared(self, prompt: str, task: str) -> tuple[PreparedPrompt, str]:
        """The prompt as the scheduler prepares it, and the exact text the model sees."""
        prepared = prepare_prompt(prompt, task, None)
        return prepared, self._text.model_text(prepared.model_prompt, prepared.chat)

    def learn_ends(self, arrivals: list, task: str = "infobench") -> None:
        """Decode every prompt not seen yet once, greedily with the target alone, to the
        most tokens any of ``arrivals`` asks of it, and keep where it ended."""
        from specbatch.decoding import Engine, GenerationRequest

        asked: dict[str, int] = {}
        for arrival in arrivals:
            _, text = self._prepared(arrival.prompt, task)
            if text not in self._ends:
                asked[text] = max(asked.get(text, 0), arrival.max_tokens)
        if not asked:
            return
        from tqdm import tqdm

        engine = Engine(served_pair(), lookahead=0, max_rows=LEARN_ROWS, prefix_caching=False)
        texts = list(asked)
        with tqdm(total=len(texts), desc="output lengths", unit="prompt") as progress:
            for first in range(0, len(texts), LEARN_ROWS):
                chunk = texts[first : first + LEARN_ROWS]
                results = engine.generate(
                    [GenerationRequest(text, max_new_tokens=asked[text]) for text in chunk],
                    mode="target_only",
                )
                for text, result in zip(chunk, results, strict=True):
                    self._ends[text] = result.num_output_tokens if result.finish_reason == "stop" else None
                progress.update(len(chunk))
        ended = sum(end is not None for end in self._ends.values())
        logger.info("output lengths: %d of %d prompts end before their max_tokens", ended, len(self._ends))

    def of(self, phases: list[Phase], task: str = "infobench") -> list[SimRequest]:
        """Every phase's arrivals as simulated requests, on the phases' common clock."""
        requests = []
        for phase in phases:
            for index, arrival in enumerate(phase.arrivals):
                request = self._request(phase.first_id + index, arrival, task)[0]
                requests.append(dataclasses.replace(request, arrival_s=request.arrival_s + phase.shift_s))
        return requests

    def online(
        self, phases: list[Phase], cut_rows: str, task: str = "infobench"
    ) -> Callable[[], OnlineLengths]:
        """Fresh length predictions for each simulated run of the phases' arrivals, made as
        the scheduler makes them, learning rows cut short as ``cut_rows`` says
        (:class:`OnlineLengths`)."""
        prompts = {}
        for phase in phases:
            for index, arrival in enumerate(phase.arrivals):
                _, source, ended = self._request(phase.first_id + index, arrival, task)
                prompts[phase.first_id + index] = (source, task, arrival.max_tokens, ended)
        return lambda: OnlineLengths(prompts, cut_rows)

    def _request(self, index: int, arrival, task: str) -> tuple[SimRequest, str, bool]:
        """The arrival as the simulator runs it, its prompt as the predictor reads it, and
        whether it ends at its end of sequence (not cut at its max_tokens)."""
        prepared, text = self._prepared(arrival.prompt, task)
        input_tokens = self._text.count(text)
        predicted = max(1, min(self._predictor.predict(prepared.source, task), arrival.max_tokens))
        end = self._ends.get(text)
        ended = end is not None and end <= arrival.max_tokens
        output_tokens = max(1, end) if ended else arrival.max_tokens
        request = SimRequest(index, arrival.at_s, input_tokens, output_tokens, float(predicted))
        return request, prepared.source, ended


class OnlineLengths:
    """One simulated run's length predictions, as the scheduler makes them: a fresh
    predictor asked as each prompt arrives (capped at its max_tokens) that learns from
    every row served, a row cut at its max_tokens as the server's ``length_cut_rows``
    says (:meth:`LengthPredictor.observe`)."""

    def __init__(self, prompts: dict[int, tuple[str, str, int, bool]], cut_rows: str) -> None:
        self._prompts = prompts
        self._predictor = LengthPredictor(cut_rows=cut_rows)

    def predicted(self, request: SimRequest) -> float:
        source, task, max_tokens, _ = self._prompts[request.request_id]
        return float(max(1, min(self._predictor.predict(source, task), max_tokens)))

    def served(self, request: SimRequest) -> None:
        source, task, _, ended = self._prompts[request.request_id]
        self._predictor.observe(source, task, request.output_tokens, cut=not ended)


def step_buckets(row: dict) -> list[dict]:
    """A row's committing steps by batch size (steps, row_steps, tokens, prefill_tokens,
    seconds each): the engine's per-batch counters where the run has them, else the whole
    run as one bucket at its mean batch."""
    engine = row["engine"]
    if engine.get("by_batch"):
        return list(engine["by_batch"].values())
    return [
        {
            "steps": engine["steps"],
            "row_steps": engine["row_steps"],
            "tokens": engine["row_tokens"],
            "prefill_tokens": row["prefilled_tokens"],
            "seconds": engine["step_seconds"],
            "context_slots": 0,
        }
    ]


def priced(costs: StepCosts, bucket: dict) -> float:
    """The seconds ``costs`` charge a bucket's steps."""
    return (
        bucket["steps"] * costs.base_s
        + bucket["row_steps"] * costs.per_row_s
        + bucket["tokens"] * costs.per_token_s
        + bucket["prefill_tokens"] * costs.per_prefill_token_s
        + bucket.get("context_slots", 0.0) * costs.per_context_slot_s
    )


def machine_speed(costs: StepCosts, row: dict) -> float | None:
    """How many times slower the served instances' steps ran in this row than ``costs``
    price them (None where the row has no engine figures)."""
    if not has_engine_figures(row):
        return None
    buckets = step_buckets(row)
    return sum(b["seconds"] for b in buckets) / sum(priced(costs, b) for b in buckets)


@dataclasses.dataclass(frozen=True)
class LiveStepFit:
    """A step's seconds as the served instances' own counters price it, over a run."""

    base_s: float
    per_row_s: float
    per_token_s: float
    per_prefill_token_s: float
    per_context_slot_s: float
    rows: int
    buckets: int  # the (row, batch size) figures fitted

    def costs(self, row: dict) -> StepCosts:
        """The step costs of one row: at its own tokens per row-step at each batch size
        (per bucket, at the bucket's mean rows), which the committed tokens' price turns
        into a step's cost."""
        points = sorted(
            (b["row_steps"] / b["steps"], b["tokens"] / b["row_steps"])
            for b in step_buckets(row)
            if b["steps"]
        )
        return StepCosts(
            base_s=self.base_s,
            per_row_s=self.per_row_s,
            per_prefill_token_s=self.per_prefill_token_s,
            tokens_per_row_step=tuple(points),
            per_token_s=self.per_token_s,
            per_context_slot_s=self.per_context_slot_s,
        )


def has_engine_figures(row: dict) -> bool:
    engine = row.get("engine")
    return bool(engine and engine["steps"] and engine["row_steps"])


def live_fit(rows: list[dict]) -> LiveStepFit:
    """Non-negative least squares of the step seconds of every row's batch-size buckets
    on their steps, row-steps, committed tokens, prefilled tokens and the KV slots their
    attention read (rows x each step's longest context; 0 in a run from before that
    counter, which leaves its price at 0 where no row has it). Each bucket's
    residual is taken relative to its seconds (the buckets of a slow minute or a long run
    do not outweigh the rest in setting the shape) and weighted by the square root of its
    steps (a bucket of a few steps is a noisy reading)."""
    from scipy.optimize import nnls

    usable = [r for r in rows if has_engine_figures(r)]
    buckets = [b for r in usable for b in step_buckets(r) if b["steps"] and b["seconds"] > 0]
    x = np.array(
        [
            [b["steps"], b["row_steps"], b["tokens"], b["prefill_tokens"], b.get("context_slots", 0.0)]
            for b in buckets
        ],
        dtype=float,
    )
    y = np.array([b["seconds"] for b in buckets])
    weight = np.sqrt([b["steps"] for b in buckets])
    (base, per_row, per_token, per_prefill, per_slot), _ = nnls(x / y[:, None] * weight[:, None], weight)
    return LiveStepFit(
        float(base),
        float(per_row),
        float(per_token),
        float(per_prefill),
        float(per_slot),
        len(usable),
        len(buckets),
    )


def step_shape(rows: list[dict], live: LiveStepFit) -> list[dict]:
    """Over every row with per-batch counters: each batch-size bucket's steps, mean rows,
    tokens per row-step, and mean step seconds measured (each row's at its machine speed
    brought to the fit's) against the fit's: where the fit's straight line in rows and
    tokens misses the shape of a step's cost."""
    sums: dict[str, dict[str, float]] = {}
    for row in rows:
        if not (has_engine_figures(row) and row["engine"].get("by_batch")):
            continue
        costs = live.costs(row)
        speed = machine_speed(costs, row)
        for label, bucket in row["engine"]["by_batch"].items():
            total = sums.setdefault(
                label, dict.fromkeys(("steps", "row_steps", "tokens", "seconds", "fitted"), 0.0)
            )
            for key in ("steps", "row_steps", "tokens"):
                total[key] += bucket[key]
            total["seconds"] += bucket["seconds"] / speed
            total["fitted"] += priced(costs, bucket)
    order = [label for label in STEP_BATCH_LABELS if label in sums]
    return [
        {
            "rows_up_to": label,
            "steps": int(sums[label]["steps"]),
            "mean_rows": sums[label]["row_steps"] / sums[label]["steps"],
            "tokens_per_row_step": sums[label]["tokens"] / sums[label]["row_steps"],
            "measured_step_s": sums[label]["seconds"] / sums[label]["steps"],
            "fitted_step_s": sums[label]["fitted"] / sums[label]["steps"],
        }
        for label in order
    ]


def shape_table(shape: list[dict], live: LiveStepFit) -> str:
    lines = [
        f"Live fit over {live.rows} rows ({live.buckets} batch-size buckets): a step costs "
        f"{live.base_s * 1000:.2f} ms + {live.per_row_s * 1000:.2f} ms a row + "
        f"{live.per_token_s * 1000:.2f} ms a committed token + {live.per_prefill_token_s * 1e6:.0f} µs a "
        f"prefilled token + {live.per_context_slot_s * 1e6:.2f} µs a KV slot read (rows x the step's "
        "longest context).",
        "",
        "| rows (up to) | steps | mean rows | tokens / row-step | step ms measured | fitted "
        "| measured / fitted |",
        "|---|---|---|---|---|---|---|",
    ]
    for b in shape:
        lines.append(
            f"| {b['rows_up_to']} | {b['steps']} | {b['mean_rows']:.1f} | {b['tokens_per_row_step']:.2f} "
            f"| {b['measured_step_s'] * 1000:.1f} | {b['fitted_step_s'] * 1000:.1f} "
            f"| {b['measured_step_s'] / b['fitted_step_s']:.2f} |"
        )
    return "\n".join(lines)


def at_speed(costs: StepCosts, factor: float) -> StepCosts:
    """The same step costs on a machine ``factor`` times slower."""
    return dataclasses.replace(
        costs,
        base_s=costs.base_s * factor,
        per_row_s=costs.per_row_s * factor,
        per_token_s=costs.per_token_s * factor,
        per_prefill_token_s=costs.per_prefill_token_s * factor,
    )


def measured_like(outcomes: list[SimOutcome], arrivals: list, args: argparse.Namespace) -> dict:
    """The simulated run in bench_policies' terms: goodput over the same span, TTFT p95,
    and the rows preempted for lack of KV blocks."""
    served = [o for o in outcomes if o.status == "served"]
    span = max([arrivals[-1].at_s] + [o.done_s for o in served])
    met = [o for o in served if meets_sla(o.ttft_s, o.e2e_s, arrivals[o.request.request_id], args)]
    over_sla = [o.e2e_s / e2e_sla_s(arrivals[o.request.request_id], args) for o in served]
    return {
        "goodput_rps": len(met) / span,
        "ttft_p95_s": float(np.percentile([o.ttft_s for o in served], 95)) if served else float("nan"),
        "e2e_over_sla_p99": float(np.percentile(over_sla, 99)) if served else float("nan"),
        "refused": sum(o.status != "served" for o in outcomes),
        "preemptions": sum(o.preemptions for o in outcomes),
    }


HISTORY_ID_STRIDE = 1_000_000  # request ids of the phases served before a row's own start here


@dataclasses.dataclass(frozen=True)
class Phase:
    """Arrivals a server served as one phase: their requests' ids start at ``first_id`` and
    their times move by ``shift_s`` onto the simulated run's clock."""

    arrivals: list
    first_id: int = 0
    shift_s: float = 0.0


def served_before(pairs: list[tuple[str, dict]]) -> list[list[dict]]:
    """For each (workload, row) pair, the rows its set-up's server served before that row,
    oldest first. bench_policies serves each set-up's cells of a workload on one server,
    round by round, its loads in ascending order and the prompt-heavy overload after them
    (its `plan`)."""

    def ran_at(row: dict) -> tuple[int, bool, float]:
        return row.get("round", 0), row["phase"] == "overload", row["load"] or 0.0

    return [
        sorted(
            (
                other
                for other_name, other in pairs
                if other_name == name and other["setup"] == row["setup"] and ran_at(other) < ran_at(row)
            ),
            key=ran_at,
        )
        for name, row in pairs
    ]


def history_phases(earlier: list[list], gap_s: float) -> list[Phase]:
    """The arrivals a server served before a row's (``earlier``, oldest first), placed on
    the row's clock before its own, which start at 0: each phase's first arrival ``gap_s``
    after the last arrival of the phase before it (bench_policies' drain: by then a live
    phase has ended), ids from ``HISTORY_ID_STRIDE`` up."""
    phases = []
    start_s = 0.0
    for number, arrivals in enumerate(reversed(earlier), start=1):
        shift_s = start_s - gap_s - arrivals[-1].at_s
        phases.append(Phase(arrivals, number * HISTORY_ID_STRIDE, shift_s))
        start_s = shift_s + arrivals[0].at_s
    return phases[::-1]


def simulated_rows(policies: dict) -> list[tuple[str, dict]]:
    """The (workload, row) pairs the simulator predicts: every continuous set-up's row of
    the simulated workloads, and their overload rows."""
    setups = {s.name for s in SETUPS}
    pairs = []
    for result in policies["workloads"]:
        if result["name"] in SIMULATED:
            rows = [r for r in result["rows"] if r["setup"] in setups and r["setup"] != "triton_batching"]
            pairs += [(result["name"], row) for row in rows + result.get("overloads", [])]
    return pairs


def measured_step_cv(row: dict) -> float:
    """The coefficient of variation of the row's decode steps about their batch size's
    mean, as its instances counted them (0 where the run has no such counters)."""
    buckets = (row.get("engine") or {}).get("by_batch", {}).values()
    figures = [tuple(b.get(name, 0.0) for b in buckets) for name in DECODE_SPREAD]
    return (decode_step_cv(*figures) or 0.0) if buckets else 0.0


def step_cv_choice(text: str) -> float | None:
    """`--step-cv`: a coefficient of variation >= 0, or `measured` (None: each row's own)."""
    if text == "measured":
        return None
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"a number >= 0 or 'measured', got {text!r}")
    return value


def predict_rows(
    policies: dict,
    costs: StepCosts,
    kv_tokens_per_gb: int,
    step_cv: float | None = 0.0,
    online_lengths: bool = True,
    carry_history: bool = True,
) -> tuple[list[dict], LiveStepFit]:
    """Each simulated row predicted from the live instances' step costs and from the
    offline fit's, both at the row's machine speed, each step drawn around its cost at
    ``step_cv`` (0: exact costs; None: the row's own measured spread), its lengths
    predicted as the scheduler predicts them while the run goes on (``online_lengths``)
    or once, before it, by a predictor that learns nothing; and the live fit. With
    ``carry_history`` each row's run is preceded by what its set-up's server served before
    it (the warm-up, then its earlier cells: :func:`served_before`), through the same
    policy and length predictor, as the live scheduler and router carry what they learned
    from phase to phase; without it each row starts from a fresh scheduler."""
    args = bench_args(policies["config"])
    builders = {w.name: w for w in workloads(args)}
    setups = {s.name: s for s in SETUPS}
    scheduler = config_parameters(REPOSITORY / "scheduler" / "configs" / "cpu.pbtxt")
    requests = Requests()
    default_budget = instance_settings().number("kv_memory_budget_gb")
    pairs = simulated_rows(policies)
    warm_up = warm_up_arrivals()
    requests.learn_ends(
        warm_up
        + [a for name, row in pairs for a in builders[name].build(row["rate"], args.duration, row["seed"])]
    )
    earlier_rows = served_before(pairs) if carry_history else [[] for _ in pairs]
    live = live_fit([row for _, row in pairs])
    logger.info("live step costs over %d rows (%d batch-size buckets): %s", live.rows, live.buckets, live)
    predicted = []
    for (name, row), earlier in zip(pairs, earlier_rows, strict=True):
        workload = builders[name]
        env = server_env(setups[row["setup"]], workload.env, args)
        arrivals = workload.build(row["rate"], args.duration, row["seed"])
        served = [workload.build(r["rate"], args.duration, r["seed"]) for r in earlier]
        phases = [*history_phases([warm_up, *served] if carry_history else [], args.drain), Phase(arrivals)]
        budget = float(env.get("SPECBATCH_KV_MEMORY_BUDGET_GB", default_budget))
        instance = SimInstance(kv_tokens=int(budget * kv_tokens_per_gb), max_rows=64)
        settings = ModelSettings(scheduler, ROOT, env=env)
        admission = build_admission(settings)
        sims = requests.of(phases)
        cut_rows = build_core_settings(settings).cut_rows
        lengths = requests.online(phases, cut_rows) if online_lengths else None
        row_cv = measured_step_cv(row) if step_cv is None else step_cv
        if has_engine_figures(row):
            row_costs = live.costs(row)
            live_speed, speed = machine_speed(row_costs, row), machine_speed(costs, row)
            at_live = simulate(
                admission, instance, at_speed(row_costs, live_speed), sims, arrivals, args, row_cv, lengths
            )
            offline = simulate(
                admission, instance, at_speed(costs, speed), sims, arrivals, args, row_cv, lengths
            )
        else:  # no engine figures: the offline fit as it stands, for both
            live_speed = speed = None
            at_live = offline = simulate(admission, instance, costs, sims, arrivals, args, row_cv, lengths)
        predicted.append(
            {
                "workload": name,
                "setup": row["setup"],
                "label": row["label"],
                "phase": row["phase"],
                "load": row["load"],
                "round": row.get("round", 0),
                "rate": row["rate"],
                "phases_before": len(phases) - 1,
                "speed": live_speed,
                "offline_speed": speed,
                "step_cv": row_cv,
                "engine": row.get("engine"),
                "measured_goodput_rps": row["goodput_rps"],
                "predicted_goodput_rps": at_live["goodput_rps"],
                "offline_goodput_rps": offline["goodput_rps"],
                "measured_ttft_p95_s": row["ttft_p95_s"],
                "predicted_ttft_p95_s": at_live["ttft_p95_s"],
                "measured_preemptions": row.get("preemptions"),
                "predicted_preemptions": at_live["preemptions"],
                "goodput_error": error(at_live["goodput_rps"], row["goodput_rps"]),
                "offline_error": error(offline["goodput_rps"], row["goodput_rps"]),
            }
        )
        logger.info(
            "%s %s %s x%s: goodput measured %.2f, predicted %.2f (live step costs), %.2f (offline fit)",
            name,
            row["setup"],
            row["phase"],
            row["load"],
            row["goodput_rps"],
            at_live["goodput_rps"],
            offline["goodput_rps"],
        )
    return predicted, live


def simulate(
    admission: AdmissionPolicy,
    instance: SimInstance,
    costs: StepCosts,
    requests: list[SimRequest],
    arrivals: list,
    args: argparse.Namespace,
    step_cv: float = 0.0,
    lengths: Callable[[], OnlineLengths] | None = None,
) -> dict:
    """One simulated run of a row's arrivals (and the phases served before them, whose
    requests carry ids from ``HISTORY_ID_STRIDE`` up), on two instances at these step
    costs; the row's own requests measured."""
    simulator = ContinuousSimulator(
        lambda: _fresh(admission), [instance, instance], costs, step_cv=step_cv, lengths=lengths
    )
    outcomes = simulator.run(requests)
    return measured_like([o for o in outcomes if o.request.request_id < HISTORY_ID_STRIDE], arrivals, args)


def error(predicted: float, measured: float) -> float:
    return predicted / measured - 1 if measured else float("nan")


def _fresh(admission: AdmissionPolicy) -> AdmissionPolicy:
    """A new policy with the same configuration for each simulated run."""
    return AdmissionPolicy(admission.config)


def rankings(rows: list[dict]) -> list[dict]:
    """Per workload, load and round: the set-ups in order of measured and of predicted
    goodput, and the pairs of set-ups the run decides (measured goodputs more than
    ``TOLERANCE`` apart) with how many of them the simulator orders the same. Two set-ups
    closer than that swap places between runs of the same cell, and a simulator within
    ``TOLERANCE`` of every row may order them either way: the full order can only match by
    chance. Each round is its own set of arrivals, so rounds are ranked apart."""
    cells: dict[tuple[str, float, int], list[dict]] = {}
    for row in rows:
        if row["phase"] == "load":
            cells.setdefault((row["workload"], row["load"], row.get("round", 0)), []).append(row)
    out = []
    for (workload, load, round_), members in sorted(cells.items()):
        measured = [r["setup"] for r in sorted(members, key=lambda r: -r["measured_goodput_rps"])]
        predicted = [r["setup"] for r in sorted(members, key=lambda r: -r["predicted_goodput_rps"])]
        decided = same = 0
        for index, first in enumerate(members):
            for second in members[index + 1 :]:
                low, high = sorted((first["measured_goodput_rps"], second["measured_goodput_rps"]))
                if high <= low * (1 + TOLERANCE):
                    continue
                decided += 1
                measured_gap = first["measured_goodput_rps"] - second["measured_goodput_rps"]
                predicted_gap = first["predicted_goodput_rps"] - second["predicted_goodput_rps"]
                same += measured_gap * predicted_gap > 0
        out.append(
            {
                "workload": workload,
                "load": load,
                "round": round_,
                "measured": measured,
                "predicted": predicted,
                "same": measured == predicted,
                "decided_pairs": decided,
                "decided_same": same,
            }
        )
    return out


def medians_over_rounds(rows: list[dict]) -> list[dict]:
    """Per workload, set-up and load: the median over the run's rounds of the measured
    and of the predicted goodput, and the error of the one against the other. A cell
    of a few dozen requests moves from round to round by more than the tolerance (the
    `memory` capacity of (b) read 3.07-4.03 req/s over four runs), so one round's error
    holds the live run's own spread as well as the simulator's."""
    cells: dict[tuple[str, str, str, float], list[dict]] = {}
    for row in rows:
        cells.setdefault((row["workload"], row["label"], row["phase"], row["load"]), []).append(row)
    out = []
    for (workload, label, phase, load), members in cells.items():
        measured = statistics.median(r["measured_goodput_rps"] for r in members)
        predicted = statistics.median(r["predicted_goodput_rps"] for r in members)
        out.append(
            {
                "workload": workload,
                "label": label,
                "phase": phase,
                "load": load,
                "rounds": len(members),
                "measured_goodput_rps": measured,
                "predicted_goodput_rps": predicted,
                "goodput_error": error(predicted, measured),
            }
        )
    return out


def medians_table(medians: list[dict]) -> str:
    """The medians over rounds, where some cell ran more than one."""
    if all(m["rounds"] == 1 for m in medians):
        return ""
    lines = [
        "| workload | set-up | load | rounds | goodput measured (median) | predicted (median) | error |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in medians:
        load = "2× (a)'s capacity" if m["phase"] == "overload" else f"{m['load']:g}×"
        lines.append(
            f"| {m['workload']} | {m['label']} | {load} | {m['rounds']} | {m['measured_goodput_rps']:.2f} "
            f"| {m['predicted_goodput_rps']:.2f} | {m['goodput_error']:+.0%} |"
        )
    within = sum(abs(m["goodput_error"]) <= TOLERANCE for m in medians)
    lines += [
        "",
        f"Median goodput over the rounds within {TOLERANCE:.0%} of the measured median: {within} of "
        f"{len(medians)} cells.",
    ]
    return "\n".join(lines)


def table(rows: list[dict], ranks: list[dict]) -> str:
    lines = [
        "| workload | set-up | load | tokens / row-step | step time / live fit's | step CV "
        "| goodput measured | predicted | error | from the offline fit | error "
        "| TTFT p95 measured s | predicted s | preemptions measured | predicted |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        load = "2× (a)'s capacity" if r["phase"] == "overload" else f"{r['load']:g}×"
        speed = "—" if r["speed"] is None else f"{r['speed']:.2f}×"
        engine = r["engine"]
        tokens = f"{engine['row_tokens'] / engine['row_steps']:.2f}" if r["speed"] is not None else "—"
        lines.append(
            f"| {r['workload']} | {r['label']} | {load} | {tokens} | {speed} | {r['step_cv']:.2f} "
            f"| {r['measured_goodput_rps']:.2f} "
            f"| {r['predicted_goodput_rps']:.2f} | {r['goodput_error']:+.0%} "
            f"| {r['offline_goodput_rps']:.2f} | {r['offline_error']:+.0%} "
            f"| {r['measured_ttft_p95_s']:.2f} | {r['predicted_ttft_p95_s']:.2f} "
            f"| {'—' if r['measured_preemptions'] is None else r['measured_preemptions']} "
            f"| {r['predicted_preemptions']} |"
        )
    within = sum(abs(r["goodput_error"]) <= TOLERANCE for r in rows)
    offline = sum(abs(r["offline_error"]) <= TOLERANCE for r in rows)
    lines += [
        "",
        f"Goodput within {TOLERANCE:.0%} of the measured value: {within} of {len(rows)} rows from the "
        f"live instances' step costs, {offline} of {len(rows)} from the offline fit's (both at each "
        "row's machine speed).",
        "",
        "| workload | load | round | measured order | predicted order | same | pairs more than "
        f"{TOLERANCE:.0%} apart, ordered the same |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in ranks:
        lines.append(
            f"| {r['workload']} | {r['load']:g}× | {r['round']} | {', '.join(r['measured'])} "
            f"| {', '.join(r['predicted'])} "
            f"| {'yes' if r['same'] else '**no**'} | {r['decided_same']} of {r['decided_pairs']} |"
        )
    decided = sum(r["decided_pairs"] for r in ranks)
    same = sum(r["decided_same"] for r in ranks)
    lines += [
        "",
        f"Same order at {sum(r['same'] for r in ranks)} of {len(ranks)} cells; of the pairs of set-ups "
        f"the run decides (measured goodputs more than {TOLERANCE:.0%} apart), {same} of {decided} "
        "ordered the same.",
    ]
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(11, 4.8))
    for index, (workload, marker) in enumerate(zip(SIMULATED, "osD", strict=True)):
        mine = [r for r in rows if r["workload"] == workload]
        for axis, key in zip(axes, ("goodput_rps", "ttft_p95_s"), strict=True):
            axis.scatter(
                [r[f"measured_{key}"] for r in mine],
                [r[f"predicted_{key}"] for r in mine],
                marker=marker,
                color=f"C{index}",
                label=f"{workload}, from the live step costs",
            )
        axes[0].scatter(
            [r["measured_goodput_rps"] for r in mine],
            [r["offline_goodput_rps"] for r in mine],
            marker=marker,
            facecolors="none",
            edgecolors=f"C{index}",
            label=f"{workload}, from the offline fit",
        )
    for axis, title in zip(axes, ("goodput (req/s)", "TTFT p95 (s)"), strict=True):
        top = max(max(axis.get_xlim()), max(axis.get_ylim()))
        axis.plot([0, top], [0, top], color="grey", linewidth=1)
        if title.startswith("goodput"):
            axis.fill_between(
                [0, top], [0, top * (1 - TOLERANCE)], [0, top * (1 + TOLERANCE)], color="grey", alpha=0.15
            )
        axis.set_xlabel(f"measured {title}")
        axis.set_ylabel(f"simulated {title}")
        axis.legend()
    figure.suptitle("Step simulator against the live server (bench_policies rows)")
    save_figure(figure, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--policies", type=Path, default=ROOT / "results" / "bench_policies.json")
    parser.add_argument("--fit-steps", type=int, default=64, help="tokens each row of a fitting batch asks")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "bench_predict.json")
    parser.add_argument("--plot", type=Path, default=ROOT / "docs" / "img" / "bench_predict.png")
    parser.add_argument("--markdown", type=Path, help="also write the tables here")
    parser.add_argument(
        "--step-cv",
        type=step_cv_choice,
        default=0.0,
        help="draw every row's simulated steps around their cost with this coefficient of "
        "variation, or `measured`: each row's with the spread its instances measured "
        "(default 0: exact costs)",
    )
    parser.add_argument(
        "--lengths",
        choices=("online", "fixed"),
        default="online",
        help="predict each prompt's length as it arrives, from the rows the run has ended so "
        "far, as the scheduler does (default), or once before the run",
    )
    parser.add_argument(
        "--history",
        choices=("carried", "fresh"),
        default="carried",
        help="run each row after what its set-up's server served before it, through the same "
        "scheduler, as the live one carries what it learned (default), or from a fresh scheduler",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    policies = json.loads(args.policies.read_text())
    costs, kv_tokens_per_gb, points = fit_costs(args.fit_steps)
    logger.info("offline step costs: %s", costs)
    rows, live = predict_rows(
        policies, costs, kv_tokens_per_gb, args.step_cv, args.lengths == "online", args.history == "carried"
    )
    ranks = rankings(rows)
    medians = medians_over_rounds(rows)
    shape = step_shape([row for _, row in simulated_rows(policies)], live)
    sections = [table(rows, ranks), medians_table(medians), shape_table(shape, live) if shape else ""]
    text = "\n\n".join(section for section in sections if section)
    print(text)
    plot(rows, args.plot)
    if args.markdown:
        args.markdown.write_text(text + "\n")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "costs": dataclasses.asdict(costs),
                "live_costs": dataclasses.asdict(live),
                "kv_tokens_per_gb": kv_tokens_per_gb,
                "fit": points,
                "rows": rows,
                "rankings": ranks,
                "medians_over_rounds": medians,
                "step_shape": shape,
            },
            indent=2,
            default=list,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Admission control over continuous-batching instances: whom to start, where, how many, or no.

With instances that batch at every step, the batch-forming ideas of the seeds become
admission decisions, taken per instance whenever it reports its state:

- **how many**: an instance may run min(b_mem, b_SLA) rows. b_mem comes from the KV
  blocks the instance reports free, less what the rows it already runs will still
  grow into (their predicted totals minus what they hold), less a CLT margin on the
  error of the length predictions (Algorithm 1 of Pang et al., on real blocks);
  with ``kv_reservation="peak"`` the rows count at the most they hold at once as they
  grow and leave at their predicted ends, not each at its final size (``kv_plan``);
  b_SLA is the feedback search of Algorithm 2 on the instance's measured seconds per
  token against the per-token pace the SLA allows every token (the tighter of
  ``tpot_sla_s`` and ``finish_per_token_s``). Algorithm 2 assumes a smaller batch
  brings the pace within reach; on a machine slower than the SLA was written for, even
  one row alone runs slower (b_SLA's floor, measured at its smallest batch), the search
  would shrink every instance to one row, and throughput would collapse without saving
  a row. So once the floor is above the allowance, each instance is held instead to the
  tightest pace its rows can afford and reach: a row has its finish budget
  (``finish_base_s`` plus its tokens at ``finish_per_token_s``, or its client's
  deadline) for its predicted tokens from the moment it started, and short rows carry
  the base of that budget over few tokens; a row that cannot end in time even at the
  floor counts with the pace that ends it within ``late_budgets`` of its budget (1.5),
  else within twice it (the bound a late row is promised: steered to the bound itself,
  it ends past it as often as not), and one that cannot make even that counts with
  none; ``tpot_sla_s`` bounds the pace whatever the rows
  afford. ``b_sla_pace="slack"`` holds every instance to such a pace wherever the floor
  is (the allowance is not the SLA: held to it, an instance of short rows runs one or
  two where it could run more in time), and counts a long prompt of the mix too, as it
  would start on arrival (two standard deviations above the mean predicted length), so
  that the pace does not drift, while short rows run, past what the long prompts still
  arriving can afford; ``"slack_above_allowance"`` (the server's default) holds it to
  that pace, the long prompt of the mix counted, but never to one tighter than the
  allowance: short rows that all afford more run more of them, and a row that started
  late does not shrink the batch below what the allowance runs (which slows every other
  row's start); ``"allowance"`` holds it to the allowance always (Algorithm 2 as
  written).
- **whom**: one order over the whole queue, least slack first, slack being the time
  left before the prompt's SLA (first token within ``ttft_sla_s``; finish within
  ``finish_base_s`` plus its tokens at ``finish_per_token_s``; or the client's own deadline) minus
  its predicted service time. A prompt whose SLA is already lost is served after those
  that can still make theirs, but only until it has waited its own finish budget (or
  ``starvation_s``, if shorter): then it goes first, so no prompt starves and a late one
  ends within about twice its SLA, not at the starvation bound. When the head
  of the order does not fit an instance's free memory, the next prompt in the order
  that fits goes instead (in practice a shorter one). Queued prompts are filed in bins by
  predicted length (equal-mass edges), but in this order the bins decide nothing: their
  depths are what the metrics report per bin. Rows join and leave at every step, so the
  static batch's cost that bins cut (a batch lasts as long as its longest member) does
  not arise; ``order="multibin"`` is where they decide.
- **where**: an idle or lightly loaded instance takes the next prompt; among instances
  within ``prefix_affinity_rows`` rows of the least loaded, one the prompt's prefix was
  sent to goes first (its KV blocks are likely still cached there; of several, the one
  it went to last), so the turns of a conversation and the requests sharing a system
  prompt skip their prefill. A busier holder does not: load decides. With
  ``placement="length_affine"`` (least slack only) an instance starts only prompts of
  its own range of predicted lengths, unless the prompt's home instance cannot start
  it now (:mod:`specbatch.scheduling.placement`): long rows stop slowing the steps of
  short ones and holding their rows.
- **when to say no**: the queue holds about ``queue_seconds`` of the instances'
  estimated capacity, counted in what prompts cost them (decoding shared by the rows
  they may run, prefill by the whole instance; see ``queue_bound``), never more than
  ``queue_limit`` nor fewer than ``queue_min`` prompts, and a prompt past that is
  refused at once (:class:`QueueFullError`): a prompt admitted to a longer queue would
  only miss its SLA and make the ones behind it miss theirs. So is a request that would
  start too late for its SLA, each queued prompt (in the least-slack order) taking the
  first of the instances' row slots to free up once b_mem has room for it (a running row
  frees its slot at its predicted end, or, once past it, when the recent rows that ran
  as far past their predictions ended: :class:`ResidualLengths`); and, with
  ``keep_promises``, one that would push a queued prompt that can still make its SLA
  past it. A queued prompt whose client deadline can no longer be met is shed early
  instead of taking a slot.
- **past b_SLA's rows** (``start_beside``, on by default): b_SLA's search only grows
  past the batch sizes an instance has run, so under light load it allows a row or two
  more than run, and a short prompt arriving beside long rows waits for a long row to
  end (and may be refused). With ``start_beside``, a prompt whose delay to the running
  rows (its prefill, and its steps at what one more row adds to a step, from the
  instance's per-batch-size step counters) fits in the slack every running row has left
  of its finish budget (less what prompts started so take that the instance's measured
  pace does not show yet) and that makes its own SLA starts at once beside them, within
  the instance's rows and memory, leaving the memory of one more prompt of the mix (the
  next row b_SLA allows needs it). Where
  b_SLA holds the instance to the paces its rows afford, a row that will end past its
  budget guards the slack it has left of the next end b_SLA's pace promises it, and
  one past all of them guards none; where it holds the instance to the allowance, a
  row that will end past its budget lets nothing start beside it.
- **at what pace**: the rows' ends, the queue's predicted starts and the slack of a
  start beside them are reckoned at the slowest seconds a token each instance reported
  over its last ``pace_window_steps`` committing steps (:class:`RecentPaces`), not at
  the pace it reports now: on a host whose instances share its cores, the pace swings
  two- to threefold within seconds under a prompt-heavy load, and a promise made at a
  quick moment breaks in the next slow spell. With ``beside_slowdown``, what a start
  beside the rows costs them (from the instance's step counters, means since it started)
  is multiplied by how much slower than those means the instance steps now. Both are off
  by default (a window of one step): they meet the prompt-heavy overload's tail but cost
  goodput near capacity (docs/BENCHMARKS_HISTORY.md, "Rows priced at the slowest recent pace").

``order="multibin"`` is the papers' setting (Guldogan et al. 2024, with Pang et al.'s
batch size) on live instances: an idle instance takes one batch of up to
min(b_mem, b_SLA) prompts, all from one length bin, and takes nothing more until every
row of it has left. A bin is ready when it holds a full batch or its oldest prompt has
waited ``flush_s``; among ready bins the one whose oldest prompt came first goes. Batching
similar predicted lengths together shortens a batch to about its members' common length
instead of the longest of a mixed draw.

``order="fcfs"`` with ``memory_aware=False`` and ``sla_aware=False`` is what
first-come continuous batchers (vLLM) do: one queue, arrival order, start whatever
fits in the blocks free right now. ``order="shortest_first"`` is the same with the
queue ranked by predicted output length, shortest first (a prompt waiting
``starvation_s`` goes first): the learning-to-rank serving policy, blind to SLAs.

The policy reads no clock; every call takes ``now_s``, so the simulator's virtual clock
and the server's wall clock drive the same decisions.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Hashable
from dataclasses import dataclass, field
from statistics import NormalDist

from specbatch.scheduling.bins import BinBoundaries
from specbatch.scheduling.dynamic import RunningStats, SlaBatchController
from specbatch.scheduling.errors import DuplicateRequestError, PolicyConfigError, UnknownWorkerError
from specbatch.scheduling.kv_plan import KV_RESERVATIONS, KvForecast, KvPlan, KvRow
from specbatch.scheduling.load import InstanceLoad
from specbatch.scheduling.pace_window import RecentPaces
from specbatch.scheduling.placement import PLACEMENTS, LengthAffinity
from specbatch.scheduling.prefixes import PrefixHolders
from specbatch.scheduling.requests import QueuedRequest
from specbatch.scheduling.residual_lengths import ResidualLengths

ORDERS = ("least_slack", "multibin", "fcfs", "shortest_first")
PACES = ("slack", "slack_above_allowance", "allowance_in_reach", "allowance")  # what b_SLA holds to
SLACK_PACES = ("slack", "slack_above_allowance")  # the paces that count a long prompt of the mix
UNBINNED = ("fcfs", "shortest_first")  # one queue, no capacity-sized bound
PACE_TOLERANCE = 0.1  # b_SLA's band around its pace (ε_D), as a share of the pace
LATE_BOUND_BUDGETS = 2.0  # a row that cannot make its finish budget still ends within this many


class QueueFullError(RuntimeError):
    """The queue is at its bound: the prompt is refused now rather than served late."""


@dataclass(frozen=True)
class InstanceCapacity:
    """What admission allows an instance now, as its metrics gauges show it."""

    rows_allowed: int  # min(b_mem's row cap, b_SLA)
    b_sla: int | None  # None: b_SLA is off (``sla_aware=False``)
    pace_s: float | None  # seconds a token b_SLA holds the instance to; None when it is off


@dataclass(frozen=True)
class AdmissionConfig:
    order: str = "least_slack"
    num_bins: int = 4
    queue_limit: int = 256
    queue_min: int = 8
    queue_seconds: float = 2.0
    ttft_sla_s: float = 2.0
    tpot_sla_s: float = 0.1
    starvation_s: float = 10.0
    max_rows: int = 64
    memory_aware: bool = True
    sla_aware: bool = True
    shed_deadlines: bool = True
    eps_mem: float = 0.05
    prefill_tokens_per_s: float = 2000.0  # until an instance has measured its own
    max_predicted_tokens: float = 1024.0
    prefix_affinity_rows: int = 2  # how much busier a prefix's holder may be and still get it; -1: off
    flush_s: float = 0.5  # multibin: how long a bin's oldest prompt waits for a full batch
    # a prompt's last token is due within finish_base_s + its tokens x finish_per_token_s
    # (None: ttft_sla_s and tpot_sla_s); b_SLA holds the per-token pace to the tighter of
    # tpot_sla_s and finish_per_token_s
    finish_base_s: float | None = None
    finish_per_token_s: float | None = None
    # b_SLA's pace: the allowance while one row alone reaches it, else what the running
    # rows can afford of their budgets ("allowance_in_reach"); the latter always
    # ("slack"); the latter, never tighter than the allowance ("slack_above_allowance",
    # the default); the allowance always ("allowance")
    b_sla_pace: str = "slack_above_allowance"
    # refuse a request that would push a queued prompt past the SLA it can still make
    keep_promises: bool = True
    # past b_SLA's rows, start a prompt whose delay to the running rows fits in their slack
    start_beside: bool = True
    # the end b_SLA steers a row to, in finish budgets, where the row cannot make the
    # budget itself at the floor (bounded by LATE_BOUND_BUDGETS)
    late_budgets: float = 1.5
    # which instance starts a prompt: the least loaded, or (least slack only) its predicted
    # length's home instance unless that one cannot start it now
    placement: str = "least_loaded"
    # rows are priced at the slowest seconds a token an instance reported over its last
    # this many committing steps (1: the pace it reports now)
    pace_window_steps: int = 1
    # a start beside the rows is charged at the instance's slowdown now (its cycle over
    # the mean step of its batch size), not at its counters' means alone
    beside_slowdown: bool = False
    # b_mem counts every row at its final size ("ends", Algorithm 1) or the most its rows
    # hold at once as they grow and leave at their predicted ends ("peak"; kv_plan.py)
    kv_reservation: str = "ends"

    def __post_init__(self) -> None:
        if self.order not in ORDERS:
            raise PolicyConfigError(f"order must be one of {ORDERS}, got {self.order!r}")
        if self.b_sla_pace not in PACES:
            raise PolicyConfigError(f"b_sla_pace must be one of {PACES}, got {self.b_sla_pace!r}")
        if self.placement not in PLACEMENTS:
            raise PolicyConfigError(f"placement must be one of {PLACEMENTS}, got {self.placement!r}")
        if self.kv_reservation not in KV_RESERVATIONS:
            raise PolicyConfigError(
                f"kv_reservation must be one of {KV_RESERVATIONS}, got {self.kv_reservation!r}"
            )
        if min(self.num_bins, self.queue_limit, self.max_rows, self.pace_window_steps) < 1:
            raise PolicyConfigError(
                "num_bins, queue_limit, max_rows and pace_window_steps must be at least 1"
            )
        for name in ("ttft_sla_s", "tpot_sla_s", "starvation_s", "prefill_tokens_per_s", "flush_s"):
            value = getattr(self, name)
            if not math.isfinite(value) or value <= 0:
                raise PolicyConfigError(f"{name} must be a finite number > 0, got {value!r}")
        if self.prefix_affinity_rows < -1:
            raise PolicyConfigError(
                f"prefix_affinity_rows must be -1 (off) or more, got {self.prefix_affinity_rows}"
            )
        if not 0 < self.eps_mem < 1:
            raise PolicyConfigError(f"eps_mem must be in (0, 1), got {self.eps_mem!r}")
        if not 1.0 < self.late_budgets <= LATE_BOUND_BUDGETS:
            raise PolicyConfigError(
                f"late_budgets must be in (1, {LATE_BOUND_BUDGETS:g}], got {self.late_budgets!r}"
            )
        for name in ("finish_base_s", "finish_per_token_s"):
            value = getattr(self, name)
            if value is not None and (not math.isfinite(value) or value <= 0):
                raise PolicyConfigError(f"{name} must be a finite number > 0 or None, got {value!r}")

    @property
    def pace_s(self) -> float:
        """Seconds a token b_SLA holds each instance to: the per-token SLA, or the finish
        budget's allowance per token where that is tighter (a long row running slower
        than its allowance misses its end however soon it started)."""
        allowance = self.tpot_sla_s if self.finish_per_token_s is None else self.finish_per_token_s
        return min(self.tpot_sla_s, allowance)

    @property
    def promised_budgets(self) -> tuple[float, ...]:
        """The ends b_SLA steers a row to, in finish budgets, the first it can reach first:
        the budget; for a row that cannot make it at the floor, ``late_budgets``; and one
        that cannot make that, the bound (``LATE_BOUND_BUDGETS``). Steered to the bound
        itself, a late row ends past it about as often as not: b_SLA lets the pace run to
        the top of its band, and rows joining slow the steps before it shrinks."""
        return tuple(sorted({1.0, self.late_budgets, LATE_BOUND_BUDGETS}))

    def finish_budget_s(self, predicted_tokens: float) -> float:
        """Seconds from arrival a prompt of this predicted length has to its last token."""
        base = self.ttft_sla_s if self.finish_base_s is None else self.finish_base_s
        per_token = self.tpot_sla_s if self.finish_per_token_s is None else self.finish_per_token_s
        return base + predicted_tokens * per_token


@dataclass(frozen=True)
class _BesideCharge:
    """What a prompt started past b_SLA's rows delays each running row by: its prefill,
    a stall they pay once, and its steps, what one more row adds to each step it runs."""

    prefill_s: float
    steps_s: float

    def unmeasured_s(self, steps_since: int, pace_smoothing: float) -> float:
        """The part of the charge the instance's measured pace does not show,
        ``steps_since`` committing steps after the prompt started: the rows' slack is
        reckoned at that pace, which takes in the delay of each step run since (each
        weighs ``pace_smoothing`` in it) but not a stall it has moved past."""
        return self.prefill_s + self.steps_s * (1.0 - pace_smoothing) ** max(0, steps_since)


@dataclass(frozen=True)
class _AdmittedRow:
    """A prompt an instance was told to start, as admission remembers it."""

    request: QueuedRequest
    start_s: float
    need: float  # KV tokens it will hold at its end: input + predicted
    # the seconds a token it can run at and end within each of the config's promised_budgets
    affordable_paces_s: tuple[float, ...]
    steps_at_start: int  # the instance's committing steps when it started
    beside: _BesideCharge | None = None  # started past b_SLA's rows


@dataclass
class _Instance:
    load: InstanceLoad
    sla: SlaBatchController | None
    paces: RecentPaces
    running: dict[Hashable, _AdmittedRow] = field(default_factory=dict)

    def reported(self, load: InstanceLoad) -> None:
        self.load = load
        self.paces.record(load.batch_steps.committed_steps, load.seconds_per_token)

    @property
    def rows(self) -> int:
        return len(self.running)


class AdmissionPolicy:
    """Per-instance admission over a bounded, binned, least-slack queue. Not thread-safe."""

    def __init__(self, config: AdmissionConfig) -> None:
        self.config = config
        self._bins = BinBoundaries(
            1 if config.order in UNBINNED else config.num_bins, high=config.max_predicted_tokens
        )
        self._queued: dict[Hashable, tuple[int, QueuedRequest]] = {}
        self._instances: dict[str, _Instance] = {}
        self._prefix_holders = PrefixHolders()
        self._affinity = LengthAffinity()
        self._prediction_error = RunningStats()
        self._residuals = ResidualLengths()
        self._predicted = RunningStats()
        self._inputs = RunningStats()
        self._theta = NormalDist().inv_cdf(1.0 - config.eps_mem)

    # ---- the queue --------------------------------------------------------------------

    @property
    def queued(self) -> int:
        return len(self._queued)

    def depths(self) -> list[int]:
        """Prompts waiting per length bin."""
        depths = [0] * (1 if self.config.order in UNBINNED else self.config.num_bins)
        for bin_index, _ in self._queued.values():
            depths[bin_index] += 1
        return depths

    def enqueue(self, request: QueuedRequest) -> None:
        """Queue a prompt, or raise QueueFullError at once when the queue is at its bound."""
        self.enqueue_all([request])

    def enqueue_all(self, requests: list[QueuedRequest]) -> None:
        """Queue all of one request's prompts, or none (QueueFullError) when they do not fit."""
        for request in requests:
            if request.request_id in self._queued:
                raise DuplicateRequestError(f"request {request.request_id!r} is already queued")
        limit = self.queue_bound()
        if requests and len(self._queued) + len(requests) > limit:
            raise QueueFullError(
                f"the server is overloaded: {len(self._queued)} prompts are queued "
                f"(limit {limit}); retry later"
            )
        broken = self._broken_sla(requests) if requests else None
        if broken is not None:
            raise QueueFullError(
                f"the server is overloaded ({len(self._queued)} prompts queued): {broken}; retry later"
            )
        for request in requests:
            self._bins.observe(request.predicted_tokens)
            self._affinity.observe(request.predicted_tokens)
            self._predicted.add(request.predicted_tokens)
            self._inputs.add(request.input_tokens)
            self._queued[request.request_id] = (self._bins.assign(request.predicted_tokens), request)

    def bin_of(self, request_id: Hashable) -> int | None:
        """The length bin a queued prompt waits in (None when it is not queued)."""
        entry = self._queued.get(request_id)
        return None if entry is None else entry[0]

    def queue_bound(self) -> int:
        """How many prompts may wait now: ``queue_seconds`` of estimated capacity.

        Capacity is counted in the work prompts cost, not in rows: an instance running r
        rows finishes a prompt's decoding every (predicted tokens x seconds per token) / r
        seconds, and its prefill holds the whole instance for (prompt tokens x seconds per
        prompt token). So a prompt-heavy mix (long prompts, scoring rows of one token) is
        given a queue its instances can really drain in ``queue_seconds``."""
        cfg = self.config
        if cfg.order in UNBINNED or not self._instances or self._predicted.count == 0:
            return cfg.queue_limit
        decode_s = max(self._predicted.mean, 1.0) * self._tpot_estimate()
        prefill_s = self._inputs.mean * self._prefill_s_per_token()
        prompts_per_s = sum(
            1.0 / (decode_s / self._row_cap(instance) + prefill_s) for instance in self._instances.values()
        )
        bound = int(prompts_per_s * cfg.queue_seconds)
        return min(cfg.queue_limit, max(cfg.queue_min, bound))

    def _broken_sla(self, requests: list[QueuedRequest]) -> str | None:
        """Which SLA that can still be kept admitting this request would break, or None:
        its own (it would start after its slack runs out), or, with ``keep_promises``, that
        of a queued prompt it would go ahead of and push past its slack. Start times come
        from :meth:`_predicted_starts`. A request that starts at once is admitted however
        tight its SLA, and a queued prompt whose SLA is already lost does not veto arrivals.
        Without the second test a newcomer with less slack overtakes a prompt admitted
        earlier, again and again under overload, until that one has waited its finish
        budget and ends at twice its SLA or later: the promise to the earlier prompt is
        broken instead of the newcomer being refused at once. Only the least-slack order
        has such an ahead; multibin and the unbinned orders do not look at SLAs."""
        if self.config.order != "least_slack" or not self._instances:
            return None
        tpot = self._tpot_estimate()
        now_s = min(request.arrival_s for request in requests)
        queued = [request for _, request in self._queued.values()]
        starts = self._predicted_starts(queued + requests, now_s, tpot)
        for request in requests:
            start_s = starts[request.request_id]
            late = start_s > now_s and start_s > now_s + self._slack(request, now_s, tpot)
            if late and not any(self._beside(i, [request], 1, now_s) for i in self._instances.values()):
                return "this request would start too late to meet its SLA"
        if not self.config.keep_promises:
            return None
        latest = {r.request_id: now_s + self._slack(r, now_s, tpot) for r in queued}
        late = [r for r in queued if starts[r.request_id] > latest[r.request_id]]
        if not late:  # no queued prompt misses its SLA with the newcomer: none is pushed past it
            return None
        before = self._predicted_starts(queued, now_s, tpot)
        for request in late:
            if before[request.request_id] <= latest[request.request_id]:
                return "this request would make one admitted before it miss its SLA"
        return None

    def _predicted_starts(
        self, requests: list[QueuedRequest], now_s: float, tpot: float
    ) -> dict[Hashable, float]:
        """When each prompt would start if nothing else arrived. Each of the instances' row
        slots takes, when it frees up, the prompt the least-slack order puts first at that
        moment: one promoted by then, else the one with the least slack left, else one
        whose SLA is lost by then, in arrival order. An instance's slots: those free now
        (rows it may run beyond those it runs), and the slots its running rows free when
        their predicted tokens are done at ``tpot`` seconds a token, counted from their
        start, as many as b_SLA's lower bound lets it keep. b_SLA moves within its bounds
        as it searches, and a start promised on its midpoint breaks when it shrinks; with
        the lower bound, fewer admitted prompts end late and more are served in time under
        overload (docs/BENCHMARKS_HISTORY.md, "Admission that refuses by predicted start times").
        With b_mem, a slot starts its prompt only once the instance's KV cache has room for
        it (:class:`KvForecast`), and waits for the next row to leave until then: where
        memory binds, a freed slot does not fit the next long prompt, and starts counted
        in slots alone admit prompts that then wait for memory past their SLA. An instance
        whose cache holds its rows and all these prompts at their ends at once is not
        forecast: no start there waits for memory, and the arrival's work stays linear."""
        slots: list[tuple[float, int, str]] = []  # (when it frees up, tie-break, instance)
        forecasts: dict[str, KvForecast] = {}
        everyone = tuple(self._kv_row(request) for request in requests) if self.config.memory_aware else ()
        for name, instance in self._instances.items():
            running = instance.running.values()
            ends = [self._end_s(instance, row, now_s, tpot) for row in running]
            cap = self._row_cap(instance)
            kept = cap if instance.sla is None else min(cap, max(instance.sla.b_low, 1))
            frees = [now_s] * max(cap - len(ends), 0) + sorted(ends)[max(len(ends) - kept, 0) :]
            slots.extend((start_s, len(slots), name) for start_s in frees)
            if not self.config.memory_aware:
                continue
            plan = self._kv_plan(instance)
            if not plan.holds_at_their_ends(everyone, self._margin(len(plan.rows) + len(everyone))):
                leaves = [max(end_s, now_s + tpot) for end_s in ends]  # none before its next step
                forecasts[name] = KvForecast(plan, leaves, now_s, tpot)
        if not slots:  # no instance may run a row: nothing starts
            return {request.request_id: math.inf for request in requests}
        heapq.heapify(slots)
        by_promotion = [(r.arrival_s + self._promotion_s(r), i) for i, r in enumerate(requests)]
        by_latest = [(now_s + self._slack(r, now_s, tpot), i) for i, r in enumerate(requests)]
        heapq.heapify(by_promotion)
        heapq.heapify(by_latest)
        promoted: list[tuple[float, int]] = []  # (arrival, index)
        lost: list[tuple[float, int]] = []
        taken: set[int] = set()
        starts = {}
        while len(taken) < len(requests):
            start_s, tie, name = heapq.heappop(slots)
            while by_promotion and by_promotion[0][0] <= start_s:
                index = heapq.heappop(by_promotion)[1]
                heapq.heappush(promoted, (requests[index].arrival_s, index))
            while by_latest and by_latest[0][0] < start_s:
                index = heapq.heappop(by_latest)[1]
                heapq.heappush(lost, (requests[index].arrival_s, index))
            index = _first_untaken(promoted, taken)
            if index is None:
                index = _first_untaken(by_latest, taken)
            if index is None:  # every prompt not taken is in by_latest or in lost
                index = _first_untaken(lost, taken)
            request = requests[index]
            forecast = forecasts.get(name)
            end_s = start_s + self._service_s(request, tpot)
            if forecast is not None:
                row = self._kv_row(request)
                room_s = forecast.first_room_s(row, start_s, self._margin)
                if room_s > start_s:  # the slot waits for a row to leave
                    heapq.heappush(slots, (room_s, tie, name))
                    continue
                forecast.add(row, start_s + self._prefill_s(request), end_s)
            taken.add(index)
            starts[request.request_id] = start_s
            heapq.heappush(slots, (end_s, tie, name))
        return starts

    def requeue(self, request: QueuedRequest) -> None:
        """Put back a prompt whose instance failed before it produced anything (bound ignored)."""
        self._queued[request.request_id] = (self._bins.assign(request.predicted_tokens), request)

    def cancel(self, request_id: Hashable) -> QueuedRequest | None:
        entry = self._queued.pop(request_id, None)
        return None if entry is None else entry[1]

    def shed(self, now_s: float) -> list[QueuedRequest]:
        """Queued prompts whose client deadline has passed or can no longer be met: fail them now."""
        shed = []
        tpot = self._tpot_estimate()
        for key, (_, request) in list(self._queued.items()):
            if request.deadline_s is None:
                continue
            if request.deadline_s <= now_s or (
                self.config.shed_deadlines and now_s + self._service_s(request, tpot) > request.deadline_s
            ):
                del self._queued[key]
                shed.append(request)
        return shed

    def next_wakeup_s(self, now_s: float) -> float | None:
        """The next moment the order or the shedding changes without any event."""
        times = []
        tpot = self._tpot_estimate()
        flushing = self.config.order == "multibin"
        for _, request in self._queued.values():
            times.append(request.arrival_s + self._promotion_s(request))
            if flushing:
                times.append(request.arrival_s + self.config.flush_s)
            if request.deadline_s is not None:
                times.append(request.deadline_s - self._service_s(request, tpot))
        future = [t for t in times if t > now_s]
        return min(future) if future else None

    # ---- the instances ----------------------------------------------------------------

    def add_instance(self, name: str, load: InstanceLoad) -> None:
        sla = None
        if self.config.sla_aware:
            b_max = min(self.config.max_rows, load.max_rows)
            pace = self.config.pace_s
            sla = SlaBatchController(pace, PACE_TOLERANCE * pace, 2, 1, 1, b_max, 8)
        instance = _Instance(load, sla, RecentPaces(self.config.pace_window_steps))
        instance.reported(load)
        self._instances[name] = instance

    def remove_instance(self, name: str) -> list[Hashable]:
        """Forget an instance; the keys of the rows it was running (the caller settles them)."""
        instance = self._instances.pop(name, None)
        self._prefix_holders.forget(name)
        return [] if instance is None else list(instance.running)

    def report(self, name: str, load: InstanceLoad) -> None:
        """An instance's fresh measurements; steers its b_SLA when it is running rows."""
        instance = self._instance(name)
        instance.reported(load)
        if instance.sla is not None and load.running > 0 and load.seconds_per_token > 0:
            pace = self._pace_s(instance)
            instance.sla.retarget(pace, PACE_TOLERANCE * pace)
            instance.sla.update(load.seconds_per_token, load.running)

    def finished(self, name: str, request: QueuedRequest, output_tokens: int) -> None:
        """A row left its instance; its actual length teaches the memory margin."""
        instance = self._instances.get(name)
        if instance is not None:
            instance.running.pop(request.request_id, None)
        if output_tokens > 0:
            self._prediction_error.add(output_tokens - request.predicted_tokens)
            self._residuals.add(output_tokens - request.predicted_tokens)

    def capacity(self, name: str) -> InstanceCapacity:
        """What instance ``name`` is allowed now: rows, b_SLA and its pace (for its gauges)."""
        instance = self._instance(name)
        if instance.sla is None:
            return InstanceCapacity(self._row_cap(instance), None, None)
        return InstanceCapacity(self._row_cap(instance), instance.sla.b_sla, self._pace_s(instance))

    def admit_spread(self, now_s: float) -> dict[str, list[QueuedRequest]]:
        """What every instance starts now: one prompt at a time to the instance running the
        fewest rows that can take one, so that light load spreads over the instances (each
        with its own device) instead of packing onto the first; the holder of the next
        prompt's prefix goes first when it is nearly as idle (``prefix_affinity_rows``)."""
        started: dict[str, list[QueuedRequest]] = {}
        if self.config.order == "multibin":
            for name in sorted(self._instances, key=lambda n: self._instances[n].rows):
                chosen = self.admit(name, now_s)
                if chosen:
                    started[name] = chosen
            return started
        while self._queued:
            name, chosen = self._admit_one(now_s)
            if not chosen:
                break
            started.setdefault(name, []).extend(chosen)
        return started

    def _admit_one(self, now_s: float) -> tuple[str, list[QueuedRequest]]:
        """One prompt to the first instance in placement order with a row b_SLA allows
        for it, else to the first it can start beside the running rows of."""
        names = self._placement_order(now_s)
        for beside in (False, True) if self._starts_beside else (False,):
            for name in names:
                chosen = self.admit(name, now_s, limit=1, beside=beside)
                if chosen:
                    return name, chosen
        return "", []

    def _placement_order(self, now_s: float) -> list[str]:
        """Instances by rows running, a holder of the next prompt's prefix first if one is
        within ``prefix_affinity_rows`` of the least loaded: of several, the one the prefix
        went to last, so one copy stays in use and the others can age out of their caches
        (using every copy in turn keeps each prefix cached everywhere, and the instances
        then hold half as many prefixes between them)."""
        names = sorted(self._instances, key=lambda n: self._instances[n].rows)
        if self.config.prefix_affinity_rows < 0 or len(names) < 2:
            return names
        head = self._ordered(now_s)[0]
        bound = self._instances[names[0]].rows + self.config.prefix_affinity_rows
        holders = [
            name
            for name in self._prefix_holders.holders(head.prefix_keys)
            if name in self._instances and self._instances[name].rows <= bound
        ]
        if holders:
            names.remove(holders[-1])
            names.insert(0, holders[-1])
        return names

    def admit(
        self, name: str, now_s: float, limit: int | None = None, beside: bool = True
    ) -> list[QueuedRequest]:
        """The prompts (at most ``limit``) to start on instance ``name`` now, best first;
        they leave the queue. Once the rows min(b_mem, b_SLA) allows are taken, and with
        ``beside``, prompts that fit in the running rows' slack start beside them
        (:meth:`_beside`)."""
        instance = self._instance(name)
        room = self._row_cap(instance) - instance.rows
        if limit is not None:
            room = min(room, limit)
        beside = beside and self._starts_beside
        if not self._queued or (room <= 0 and not beside):
            return []
        if self.config.order == "multibin":
            chosen = self._one_bins_batch(instance, room, now_s) if room > 0 else []
            for request in chosen:
                self._start(name, instance, request, now_s)
            return chosen
        candidates = self._ordered(now_s)
        if self._length_affine:
            candidates = [request for request in candidates if self._belongs_on(name, request)]
        chosen = self._fitting(instance, candidates, room) if room > 0 else []
        for request in chosen:
            self._start(name, instance, request, now_s)
        spare = (len(candidates) if limit is None else limit) - len(chosen)
        if beside and spare > 0:
            waiting = [request for request in candidates if request.request_id in self._queued]
            for request, charge in self._beside(instance, waiting, spare, now_s):
                self._start(name, instance, request, now_s, charge)
                chosen.append(request)
        return chosen

    def _start(
        self,
        name: str,
        instance: _Instance,
        request: QueuedRequest,
        now_s: float,
        beside: _BesideCharge | None = None,
    ) -> None:
        del self._queued[request.request_id]
        instance.running[request.request_id] = _AdmittedRow(
            request,
            now_s,
            self._need(request),
            self._affordable_paces_s(request, now_s),
            instance.load.batch_steps.committed_steps,
            beside,
        )
        self._prefix_holders.sent(request.prefix_keys, name)

    def _beside(
        self, instance: _Instance, candidates: list[QueuedRequest], spare: int, now_s: float
    ) -> list[tuple[QueuedRequest, _BesideCharge]]:
        """Up to ``spare`` of the candidates, in their order, to start now past the rows
        b_SLA allows, each with the seconds it delays the running rows by
        (:meth:`_beside_token_s`). b_SLA prices a row by the pace it holds every row to;
        a short prompt beside long rows delays each of them by its prefill and by what one
        more row adds to each step it runs, and where that fits in the slack every running
        row has left of its finish budget (less what the prompts already started beside
        them take that the instance's measured pace does not show yet), it delays none
        past its SLA. A first-come batcher starts such prompts at once; held to b_SLA's
        rows they would wait for a long row to end, and be refused. Only a prompt that
        makes its own SLA started now, within the instance's rows and memory, with b_SLA
        on. The rows are
        priced at the slower of this instance's own pace and the fleet's: an instance
        slowed by its rows or its neighbours ends its rows later than the fleet's mean
        says, and a prompt started beside them on that mean breaks their promise. And only
        where the memory left beside it still holds one more prompt of the mix: a row
        started beside holds its KV blocks as it grows, and where memory binds (a small KV
        budget, long outputs) it would take the room of the next row b_SLA allows, which
        then starts late."""
        cfg = self.config
        if not self._starts_beside or not instance.running:
            return []
        tpot = max(self._tpot_estimate(), instance.paces.slowest_s())
        rows = instance.running.values()
        keeps_late = not self._holds_allowance(instance)
        slack_s = min(self._row_slack(instance, row, now_s, tpot, keeps_late) for row in rows)
        steps_now = instance.load.batch_steps.committed_steps
        smoothing = instance.load.pace_smoothing
        budget_s = slack_s - sum(
            r.beside.unmeasured_s(steps_now - r.steps_at_start, smoothing) for r in rows if r.beside
        )
        plan = self._kv_plan(instance)
        mix = self._mix_row()
        most = min(spare, min(cfg.max_rows, instance.load.max_rows) - instance.rows)
        token_s = self._beside_token_s(instance)
        slowdown = self._slowdown(instance)
        picked: list[tuple[QueuedRequest, _BesideCharge]] = []
        for request in candidates:
            if len(picked) >= most:
                break
            if token_s is None:
                steps_s = request.predicted_tokens * tpot
            else:
                steps_s = max(request.predicted_tokens, 1.0) * token_s
            charge = _BesideCharge(self._prefill_s(request) * slowdown, steps_s * slowdown)
            cost_s = charge.prefill_s + charge.steps_s
            own_slack_s = self._slack(request, now_s, tpot)
            if cost_s > budget_s or own_slack_s < 0:
                continue
            row = self._kv_row(request)
            if not plan.fits((row, *mix), self._margin(instance.rows + len(picked) + 1)):
                continue
            plan.take(row)
            budget_s = min(budget_s - cost_s, own_slack_s)
            picked.append((request, charge))
        return picked

    def _beside_token_s(self, instance: _Instance) -> float | None:
        """Seconds each token of a prompt started beside an instance's rows delays each of
        them (besides its prefill): the seconds one more row adds to a step, as the
        instance's per-batch-size step counters show it
        (:meth:`~specbatch.scheduling.load.BatchStepTotals.row_step_s`), over the tokens a
        row commits a step. None until the counters can say: the prompt is then charged
        its whole service, as if the rows stood still while it ran."""
        steps = instance.load.batch_steps
        row_step_s = steps.row_step_s(self._prefill_s_per_token())
        return None if row_step_s is None else row_step_s / steps.tokens_per_row_step

    def _slowdown(self, instance: _Instance) -> float:
        """How much slower than usual the instance runs a step now (at least 1): its cycle
        at this moment (seconds a token times the tokens a row commits a step) over the
        mean step its counters measured at its batch size since it started. What a start
        beside its rows costs them comes from those counters' means; on a host slowed now
        (both instances and the server's own work share its cores) the prefill and each
        step it adds cost that much more, and a prompt charged at the means breaks the
        rows' promise. 1 with ``beside_slowdown`` off or before that batch size ran."""
        if not self.config.beside_slowdown:
            return 1.0
        totals = instance.load.batch_steps
        mean_s = totals.mean_step_s(max(instance.load.running, 1))
        if mean_s is None or mean_s <= 0:
            return 1.0
        return max(1.0, instance.load.seconds_per_token * totals.tokens_per_row_step / mean_s)

    @property
    def _length_affine(self) -> bool:
        return self.config.placement == "length_affine" and self.config.order == "least_slack"

    def _belongs_on(self, name: str, request: QueuedRequest) -> bool:
        """Length-affine placement: whether instance ``name`` may start ``request`` now:
        it is the prompt's home, the prompt has none yet, or its home cannot start it
        now (no row allowed, or not the memory), so it spills over."""
        home = self._affinity.home(request.predicted_tokens, list(self._instances))
        if home is None or home == name:
            return True
        instance = self._instances[home]
        if self._row_cap(instance) <= instance.rows:
            return True
        plan = self._kv_plan(instance)
        return not plan.fits((self._kv_row(request),), self._margin(instance.rows + 1))

    @property
    def _starts_beside(self) -> bool:
        """Whether prompts may start past b_SLA's rows: ``start_beside``, where there is a
        b_SLA to pass (least slack, SLA-aware)."""
        cfg = self.config
        return cfg.start_beside and cfg.sla_aware and cfg.order == "least_slack"

    def _end_s(self, instance: _Instance, row: _AdmittedRow, now_s: float, tpot: float) -> float:
        """When a running row is predicted to end: its start, prefill and predicted tokens
        at ``tpot`` seconds a token; once that moment has passed, the row runs past its
        prediction, and it ends when the recent rows that ran as far past theirs went on
        to end, on average (:class:`ResidualLengths`; one step on where none ran that
        far). Its tokens made are counted in the instance's committing steps since it
        started, as b_mem counts them."""
        end_s = row.start_s + self._service_s(row.request, tpot)
        if end_s > now_s:
            return end_s
        steps = instance.load.batch_steps
        made = (steps.committed_steps - row.steps_at_start) * steps.tokens_per_row_step
        more = self._residuals.mean_residual(max(0.0, made - row.request.predicted_tokens))
        return now_s if more is None else now_s + more * tpot

    def _row_slack(
        self, instance: _Instance, row: _AdmittedRow, now_s: float, tpot: float, keeps_late: bool
    ) -> float:
        """Seconds a running row has to spare: from its predicted end (:meth:`_end_s`) to
        the end of its finish budget or, where b_SLA ``keeps_late`` promises to a late
        row, of the first later end it promises (``promised_budgets``; each no later than
        its client's deadline): the promises b_SLA's pace keeps to it. Held to the
        allowance, b_SLA keeps one, the budget itself, and a row that will end past it
        shows an instance slower than that pace: it guards all it has (none to spare).
        Held to the pace its rows can afford, b_SLA keeps the later ends to a row that
        cannot make the budget at the floor, and a row past all of them has no promise
        left to keep and no slack to guard (infinite)."""
        request = row.request
        budget_s = self.config.finish_budget_s(request.predicted_tokens)
        end_s = self._end_s(instance, row, now_s, tpot)
        for multiple in self.config.promised_budgets if keeps_late else (1.0,):
            due_s = request.arrival_s + multiple * budget_s
            if request.deadline_s is not None:
                due_s = min(due_s, request.deadline_s)
            if due_s >= end_s:
                return due_s - end_s
        return math.inf if keeps_late else 0.0

    # ---- internals --------------------------------------------------------------------

    def _fitting(
        self, instance: _Instance, candidates: list[QueuedRequest], room: int
    ) -> list[QueuedRequest]:
        """Up to ``room`` of the candidates, in their order, whose KV fits the instance's
        cache with the CLT margin; first come first served stops at the first misfit. An
        idle instance has no rows for a margin to protect, and starts a prompt that outgrows
        even its empty cache: its engine answers that prompt alone with an error, where
        waiting for room that never comes would leave it queued for ever."""
        plan = self._kv_plan(instance)
        chosen: list[QueuedRequest] = []
        for request in candidates:
            if len(chosen) == room:
                break
            row = self._kv_row(request)
            rows = instance.rows + len(chosen)
            fits = plan.fits((row,), self._margin(rows + 1) if rows else 0.0)
            if not fits and (rows or not plan.never_holds(row)):
                if self.config.order != "least_slack":
                    break  # the head of the order is not overtaken
                continue
            plan.take(row)
            chosen.append(request)
        return chosen

    def _one_bins_batch(self, instance: _Instance, room: int, now_s: float) -> list[QueuedRequest]:
        """Multibin: an idle instance's next batch, from the ready bin whose oldest prompt
        came first; an instance still running its batch takes nothing."""
        if instance.rows:
            return []
        bins: dict[int, list[QueuedRequest]] = {}
        for bin_index, request in self._queued.values():
            bins.setdefault(bin_index, []).append(request)
        ready = []
        for members in bins.values():
            members.sort(key=lambda request: request.arrival_s)
            if len(members) >= room or now_s - members[0].arrival_s >= self.config.flush_s:
                ready.append(members)
        if not ready:
            return []
        return self._fitting(instance, min(ready, key=lambda members: members[0].arrival_s), room)

    def _instance(self, name: str) -> _Instance:
        try:
            return self._instances[name]
        except KeyError:
            raise UnknownWorkerError(f"unknown instance {name!r}") from None

    def _row_cap(self, instance: _Instance) -> int:
        cap = min(self.config.max_rows, instance.load.max_rows)
        if instance.sla is not None:
            cap = min(cap, max(instance.sla.b_sla, 1))
        return cap

    def _pace_s(self, instance: _Instance) -> float:
        """Seconds a token b_SLA holds the instance to now: the tightest pace its running
        rows (with ``b_sla_pace`` ``"slack"`` or ``"slack_above_allowance"``, and a long
        prompt of the mix: :meth:`_newcomer_paces_s`) can afford of their finish budgets
        and reach (no faster than b_SLA's floor), within ``tpot_sla_s`` (see the
        module's docstring), and with ``"slack_above_allowance"`` no tighter than the
        allowance; the SLA's per-token allowance before a row runs, always with
        ``"allowance"``, and with ``"allowance_in_reach"`` while one row alone was
        measured to reach it."""
        cfg = self.config
        if not instance.running or self._holds_allowance(instance):
            return cfg.pace_s
        floor = None if instance.sla is None else instance.sla.floor_s
        affordable = [row.affordable_paces_s for row in instance.running.values()]
        if cfg.b_sla_pace in SLACK_PACES and self._predicted.count:
            affordable.append(self._newcomer_paces_s())
        reachable = [next((pace for pace in paces if pace >= (floor or 0.0)), None) for paces in affordable]
        saved = [pace for pace in reachable if pace is not None]
        pace = min(cfg.tpot_sla_s, *saved) if saved else cfg.tpot_sla_s
        return max(pace, cfg.pace_s) if cfg.b_sla_pace == "slack_above_allowance" else pace

    def _holds_allowance(self, instance: _Instance) -> bool:
        """Whether b_SLA holds the instance to the SLA's per-token allowance (always with
        ``"allowance"``; with ``"allowance_in_reach"`` while one row alone reaches it),
        rather than to the paces its rows can afford."""
        cfg = self.config
        if cfg.b_sla_pace == "allowance":
            return True
        floor = None if instance.sla is None else instance.sla.floor_s
        return cfg.b_sla_pace == "allowance_in_reach" and (
            floor is None or floor <= cfg.pace_s * (1.0 + PACE_TOLERANCE)
        )

    def _newcomer_paces_s(self) -> tuple[float, ...]:
        """The paces a long prompt of the mix (two standard deviations above the mean
        predicted length the queue has seen) affords started on arrival, to end within
        each of the ends b_SLA promises (``promised_budgets``). Rows that afford more
        would let the pace drift past what such a prompt can afford, and the instance
        then refuses long prompts (they would start too late at its pace) or serves them
        late while it drains."""
        tokens = min(
            self.config.max_predicted_tokens,
            max(1.0, self._predicted.mean + 2.0 * math.sqrt(self._predicted.variance)),
        )
        long_prompt = QueuedRequest("a long prompt of the mix", tokens, round(self._inputs.mean), 0.0)
        return self._affordable_paces_s(long_prompt, 0.0)

    def _affordable_paces_s(self, request: QueuedRequest, start_s: float) -> tuple[float, ...]:
        """Seconds a token a prompt started at ``start_s`` can run at, after its prefill,
        and still end within each of the ends b_SLA promises (``promised_budgets``: its
        finish budget, then the later ones of a late row; each no later than its
        client's deadline)."""
        budget_s = self.config.finish_budget_s(request.predicted_tokens)
        tokens = max(request.predicted_tokens, 1.0)
        paces = []
        for budgets in self.config.promised_budgets:
            end_s = request.arrival_s + budgets * budget_s
            if request.deadline_s is not None:
                end_s = min(end_s, request.deadline_s)
            paces.append((end_s - start_s - self._prefill_s(request)) / tokens)
        return tuple(paces)

    def _need(self, request: QueuedRequest) -> float:
        """KV tokens a row will hold at its end (by prediction), or only its prompt for fcfs."""
        if not self.config.memory_aware:
            return request.input_tokens + 1
        return request.input_tokens + request.predicted_tokens

    def _mix_row(self) -> tuple[KvRow, ...]:
        """A prompt of the mix as b_mem counts it started now: the means of the prompts
        queued so far (none before the first, or without b_mem)."""
        if not self.config.memory_aware or self._predicted.count == 0:
            return ()
        if self._plans_peak:
            return (KvRow(self._inputs.mean, self._predicted.mean),)
        return (KvRow(self._inputs.mean + self._predicted.mean, 0.0),)

    @property
    def _plans_peak(self) -> bool:
        return self.config.memory_aware and self.config.kv_reservation == "peak"

    def _kv_row(self, request: QueuedRequest) -> KvRow:
        """A prompt started now as b_mem counts it: its prompt held, its predicted tokens
        to come; or, counted at its end, all of it held (``_need``) from now."""
        if self._plans_peak:
            return KvRow(request.input_tokens, request.predicted_tokens)
        return KvRow(self._need(request), 0.0)

    def _kv_plan(self, instance: _Instance) -> KvPlan:
        """The instance's cache with its rows (and rows sent but not yet started) as b_mem
        counts them. Counted at their ends, each row holds its final size from now, and
        what the instance holds beyond those sizes is held by something else. Counted at
        the peak, a row holds its prompt and the tokens it made since it started and
        grows by its predicted tokens left; what the instance holds beyond the rows'
        tokens is held by something else (cached prefixes). Each row also takes the rest
        of its last block and the slots a speculative step grows it by (``lookahead_slots``):
        a cache filled to the rows' tokens alone turns speculation off. The rows of an
        instance step together, so what a row made is the instance's committing steps
        since it started times the tokens a row commits a step: counted in steps, not in
        seconds at the pace now, which would put a row's end sooner than it comes whenever
        the steps ran slower before."""
        load = instance.load
        admitted = instance.running.values()
        if not self._plans_peak:
            rows = [KvRow(row.need, 0.0) for row in admitted]
            other = max(0.0, load.held_tokens - sum(row.held for row in rows))
            return KvPlan(load.total_tokens, other, 0.0, rows)
        steps = load.batch_steps
        rows = []
        for row in admitted:
            predicted = row.request.predicted_tokens
            made = (steps.committed_steps - row.steps_at_start) * steps.tokens_per_row_step
            made = min(predicted, max(0.0, made))
            rows.append(KvRow(row.request.input_tokens + made, predicted - made))
        other = max(0.0, load.held_tokens - sum(row.held for row in rows))
        return KvPlan(load.total_tokens, other, load.block_size - 1 + load.lookahead_slots, rows)

    def _margin(self, rows: int) -> float:
        """CLT margin on the summed error of ``rows`` length predictions."""
        if not self.config.memory_aware or self._prediction_error.count < 2:
            return 0.0
        return self._theta * math.sqrt(self._prediction_error.variance * rows)

    def _service_s(self, request: QueuedRequest, tpot: float) -> float:
        """Predicted seconds from start to last token at ``tpot`` seconds per token."""
        return self._prefill_s(request) + request.predicted_tokens * tpot

    def _prefill_s(self, request: QueuedRequest) -> float:
        return request.input_tokens * self._prefill_s_per_token()

    def _prefill_s_per_token(self) -> float:
        """What the instances measured a prompt token costs, else the configured rate."""
        measured = [
            i.load.prefill_seconds_per_token
            for i in self._instances.values()
            if i.load.prefill_seconds_per_token > 0
        ]
        return sum(measured) / len(measured) if measured else 1.0 / self.config.prefill_tokens_per_s

    def _tpot_estimate(self) -> float:
        """Seconds a token the fleet's rows are priced at: the mean over the instances
        that measured one of the slowest pace each reported over its last
        ``pace_window_steps`` committing steps (:class:`RecentPaces`)."""
        measured = [i.paces.slowest_s() for i in self._instances.values() if i.load.seconds_per_token > 0]
        return sum(measured) / len(measured) if measured else self.config.tpot_sla_s

    def _ordered(self, now_s: float) -> list[QueuedRequest]:
        requests = [request for _, request in self._queued.values()]
        if self.config.order == "fcfs":
            return requests  # dict order is arrival order
        cfg = self.config
        if cfg.order == "shortest_first":

            def rank(request: QueuedRequest) -> tuple[int, float, float]:
                if now_s - request.arrival_s >= cfg.starvation_s:
                    return (0, request.arrival_s, 0.0)  # starved: in arrival order, first
                return (1, request.predicted_tokens, request.arrival_s)

            return sorted(requests, key=rank)
        tpot = self._tpot_estimate()

        def priority(request: QueuedRequest) -> tuple[int, float]:
            if now_s - request.arrival_s >= self._promotion_s(request):
                return (0, request.arrival_s)
            slack = self._slack(request, now_s, tpot)
            return (1, slack) if slack >= 0 else (2, request.arrival_s)

        return sorted(requests, key=priority)

    def _promotion_s(self, request: QueuedRequest) -> float:
        """How long a prompt waits before it goes first whatever its slack: the starvation
        bound, and under least slack no longer than its own finish budget, so that a prompt
        whose SLA is lost ends within about twice that budget instead of at the bound."""
        if self.config.order != "least_slack":
            return self.config.starvation_s
        return min(self.config.starvation_s, self.config.finish_budget_s(request.predicted_tokens))

    def _slack(self, request: QueuedRequest, now_s: float, tpot: float) -> float:
        """Seconds a prompt may still wait and make its SLA (its first token within
        ``ttft_sla_s``, its last within its finish budget, and its client deadline)."""
        cfg = self.config
        service = self._service_s(request, tpot)
        slack = min(
            request.arrival_s + cfg.ttft_sla_s - now_s - self._prefill_s(request),
            request.arrival_s + cfg.finish_budget_s(request.predicted_tokens) - now_s - service,
        )
        if request.deadline_s is not None:
            slack = min(slack, request.deadline_s - now_s - service)
        return slack


def _first_untaken(heap: list[tuple[float, int]], taken: set[int]) -> int | None:
    """The index at the top of a heap of (key, index) once those already taken are
    dropped from it; None when none is left."""
    while heap and heap[0][1] in taken:
        heapq.heappop(heap)
    return heap[0][1] if heap else None

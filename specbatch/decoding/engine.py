"""The continuous speculative engine: one loop per model pair, rows join and leave at
every step.

Each iteration of the loop (on its own thread) takes new submissions and
cancellations, drops finished, cancelled and expired rows, admits waiting rows whose
KV blocks fit, prefills new rows in chunks (a long prompt delays running rows by one
chunk per iteration, not by its whole length), then runs one decode step over every
running row: a draft-then-verify step with the K the lookahead policy picks for the
batch, or a plain step. Rows that finish hand their blocks back at once; a row that
cannot grow when the pool is full is preempted (its blocks freed, requeued at the
front, prefilled again later with the output it already has).

With ``prefix_caching`` (the default) a row starts on the full blocks of its prompt
that earlier rows computed and left named (:mod:`specbatch.decoding.prefix_cache`):
admission shares them, prefill computes only the rest, and a row that leaves makes its
named blocks evictable instead of free.

``batching="static"`` admits only into an empty engine (a batch formed, then run to
completion): the behaviour of a static batcher, kept to measure against.

:meth:`Engine.generate` is the blocking wrapper (submit all, wait all) for scripts.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from specbatch.decoding import counter_random
from specbatch.decoding.host_memory import keep_freed_memory
from specbatch.decoding.kv_blocks import BlockPool, OutOfBlocksError, blocks_in_budget
from specbatch.decoding.lookahead import (
    MAX_LOOKAHEAD,
    BatchShape,
    LookaheadPolicy,
    StepOutcome,
    iteration_costs_name,
    make_lookahead,
)
from specbatch.decoding.pair import ModelPair
from specbatch.decoding.prefix_cache import PrefixCache
from specbatch.decoding.requests import (
    GenerationRequest,
    GenerationResult,
    UnrunnableRequestError,
    check_sampling_settings,
)
from specbatch.decoding.rows import MODES, AcceptanceTracker, Row, RowHandle, RowSink
from specbatch.decoding.scoring import ChoiceScores, check_scoring_row, score_choices
from specbatch.decoding.steps import MAX_DRAFT_CATCH_UP, FeedObserver, StepRunner
from specbatch.decoding.stopping import RowOutput, StopRules
from specbatch.decoding.wrapper import BatchSink
from specbatch.scheduling.load import BatchStepCounter, InstanceLoad

logger = logging.getLogger(__name__)

ScoringDone = Callable[[ChoiceScores | None, str], None]

BATCHING = ("continuous", "static")
DEFAULT_ROWS_OF_CONTEXT = 1024  # default pool: max_rows rows of this many tokens
STEP_SECONDS_SMOOTHING = 0.2
PREFILL_REFERENCE_TOKENS = 256  # the prompt length the reported prefill cost is priced at


@dataclass
class MemoryPeaks:
    """KV memory at its peak: what the pool reserved (blocks x block size), the tokens
    the running rows actually held then, and what one rectangular cache per batch
    (rows x (longest prompt + max_new_tokens + lookahead margin)) would have taken."""

    reserved_tokens: int = 0
    held_tokens_at_peak: int = 0
    rectangular_tokens: int = 0

    def observe(self, running: Sequence[Row], pool: BlockPool) -> None:
        reserved = pool.num_held * pool.block_size
        if reserved > self.reserved_tokens:
            self.reserved_tokens = reserved
            self.held_tokens_at_peak = sum(r.seq_len for r in running)
        if running:
            longest = max(r.prompt_length + r.request.max_new_tokens for r in running)
            self.rectangular_tokens = max(
                self.rectangular_tokens, len(running) * (longest + MAX_LOOKAHEAD + 1)
            )


@dataclass(frozen=True)
class DecodedStep:
    """One decode step as the policy is told of it once its tokens are delivered: K
    (0: plain), the batch that ran it and the plain rows beside it as they stood before
    it, how many rows in all, the accepted draft count per speculative row, the tokens
    committed, the seconds of its passes and the seconds of the iteration spent in
    passes, catch-up and waiting for the device (what is not the iteration's rest)."""

    lookahead: int
    shape: BatchShape
    beside_shape: BatchShape | None
    rows: int
    accepted: list[int]
    committed: int
    seconds: float
    timed: float


class Engine:
    """Continuous (iteration-level) batching of speculative and plain decoding over one
    :class:`ModelPair`, with KV memory in blocks.

    ``lookahead``: ``"goodput"`` (default), ``"adaptive_rule"`` or a fixed K in 0..8.
    ``kv_memory_budget_bytes`` sizes the block pool (target + draft); by default it
    holds ``max_rows`` rows of 1024 tokens (or the context, if shorter).
    ``prefill_chunk``: prompt tokens prefilled per iteration for each token a decoding
    row committed in the last step (see :meth:`_prefill_budget`).
    ``compile``: ``"none"`` (eager, the reference), ``"default"`` (torch.compile) or
    ``"cuda_graphs"`` (compiled and captured as CUDA graphs; CUDA only); see
    :mod:`specbatch.decoding.compiled`.
    ``prefix_caching``: reuse the KV blocks of prompt prefixes computed before (on by
    default; off, every prompt is computed whole).
    Building one keeps the process's freed memory for the next pass
    (:mod:`specbatch.decoding.host_memory`).
    """

    def __init__(
        self,
        pair: ModelPair,
        lookahead: int | str = "goodput",
        *,
        kv_memory_budget_bytes: int | None = None,
        block_size: int = 16,
        max_rows: int = 64,
        prefill_chunk: int = 256,
        batching: str = "continuous",
        compile: str = "none",
        prefix_caching: bool = True,
    ) -> None:
        if batching not in BATCHING:
            raise ValueError(f"batching must be one of {BATCHING}, got {batching!r}")
        if max_rows < 1 or prefill_chunk < 1:
            raise ValueError("max_rows and prefill_chunk must be at least 1")
        keep_freed_memory()
        self.pair = pair
        self.max_rows = max_rows
        self.prefill_chunk = prefill_chunk
        self.batching = batching
        if kv_memory_budget_bytes is None:
            default_tokens = max_rows * min(pair.max_context, DEFAULT_ROWS_OF_CONTEXT)
            kv_memory_budget_bytes = default_tokens * pair.kv_bytes_per_token
        num_blocks = blocks_in_budget(kv_memory_budget_bytes, block_size, pair.kv_bytes_per_token)
        if num_blocks < 1:
            raise ValueError(
                f"a KV budget of {kv_memory_budget_bytes} bytes holds no block of {block_size} tokens "
                f"({pair.kv_bytes_per_token} bytes per token)"
            )
        self.pool = BlockPool(int(num_blocks), block_size)
        self.prefixes = PrefixCache(self.pool, enabled=prefix_caching)
        self.runner = StepRunner(pair, self.pool, compile)
        shapes = self.runner.shapes
        self.lookahead: LookaheadPolicy = make_lookahead(
            lookahead, self.runner.costs, shapes.lookahead, shapes.batch
        )
        self._acceptance = AcceptanceTracker()
        self._stop_rules = StopRules(
            pair.eos_token_ids, lambda ids: pair.tokenizer.decode(ids, skip_special_tokens=True)
        )
        self._running: list[Row] = []
        self._waiting: deque[Row] = deque()
        self._incoming: list[Row] = []
        self._incoming_scoring: list[tuple[str, tuple[str, ...], ScoringDone]] = []
        self._cancel_requests: set[int] = set()
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._step_seconds = 0.0
        self._step_seconds_total = 0.0
        self._cycle_seconds_total = 0.0
        self._last_commit_at: float | None = None  # None: no row ran since the last commit
        self._seconds_per_token = 0.0
        self._tokens_per_row = 1.0  # committed per decoding row in the last step
        self._preemptions = 0
        self._lookahead_cut_steps = 0  # steps run plain where the policy chose K > 0
        self._calibrated = False
        self._lookahead_steps: Counter[int] = Counter()
        self._told: tuple[DecodedStep, float] | None = None  # the last step, for the policy
        self._tokens_per_row_step: Counter[int] = Counter()
        self._batch_steps = BatchStepCounter()
        self._memory = MemoryPeaks()
        self._snapshot = self._take_snapshot()
        # called at the start of every iteration, on the loop thread; raising fails the
        # rows the engine holds, as any fault in a step does (used to inject faults)
        self.step_hook: Callable[[], None] | None = None

    # ---- submission -------------------------------------------------------------------

    @property
    def feed_observer(self) -> FeedObserver | None:
        """Instrumentation called before every forward pass (see :class:`StepRunner`)."""
        return self.runner.feed_observer

    @feed_observer.setter
    def feed_observer(self, observer: FeedObserver | None) -> None:
        self.runner.feed_observer = observer

    def validate(self, request: GenerationRequest) -> None:
        """Raise UnrunnableRequestError (a ValueError) with a readable message if the request cannot run."""
        self._prompt_ids(request)

    def submit(
        self, request: GenerationRequest, sink: RowSink, key: int = 0, mode: str = "speculative"
    ) -> RowHandle:
        """Queue one row; its tokens and result go to ``sink`` under ``key`` (from the
        loop thread). Raises UnrunnableRequestError at once for a request that cannot run."""
        return self.submit_many([request], sink, mode, keys=[key])[0]

    def submit_many(
        self,
        requests: Sequence[GenerationRequest],
        sink: RowSink,
        mode: str = "speculative",
        keys: Sequence[int] | None = None,
    ) -> list[RowHandle]:
        """Queue several rows at once (keys 0..n-1 unless given), so they reach the same
        iteration; all are validated before any is queued."""
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; use one of {MODES}")
        if mode != "target_only" and self.pair.draft is None:
            raise ValueError(f"{mode} mode needs a draft model; this pair has none")
        keys = range(len(requests)) if keys is None else keys
        rows = [self._new_row(request, sink, key, mode) for key, request in zip(keys, requests, strict=True)]
        with self._wake:
            self._incoming.extend(rows)
            self._ensure_thread()
            self._wake.notify()
        return [row.handle for row in rows]

    def _ensure_thread(self) -> None:
        """Start the loop thread if it is not running (call holding ``_wake``)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="specbatch-engine", daemon=True)
            self._thread.start()

    def _new_row(self, request: GenerationRequest, sink: RowSink, key: int, mode: str) -> Row:
        prompt = self._prompt_ids(request)
        if request.seed is None:
            seed = int(torch.randint(0, 2**62, (1,)).item())
        else:
            seed = counter_random.as_int64(request.seed)
        output = RowOutput(
            request.max_new_tokens,
            tuple(request.stop),
            request.ignore_eos,
            request.min_tokens,
            frozenset(request.stop_token_ids),
            logprobs=None if request.logprobs is None else [],
            include_stop_str=request.include_stop_str_in_output,
        )
        return Row(
            handle=RowHandle(logprobs=output.logprobs),
            request=request,
            mode=mode,
            tokens=list(prompt),
            prompt_length=len(prompt),
            output=output,
            seed=seed,
            sink=sink,
            key=key,
        )

    def cancel(self, handle: RowHandle) -> None:
        """Drop the row at the next step (finish_reason "cancelled"); no-op once finished."""
        with self._wake:
            self._cancel_requests.add(handle.row_id)
            self._wake.notify()

    @property
    def loop_thread(self) -> threading.Thread | None:
        """The thread running iterations now (sink callbacks run on it), None when idle."""
        return self._thread

    def snapshot(self) -> InstanceLoad:
        """The load after the last iteration, as the scheduler admits by it (safe from any thread)."""
        return self._snapshot

    @property
    def acceptance(self) -> float:
        """The instance-wide acceptance α measured so far (recent steps weigh most)."""
        return self._acceptance.alpha

    @property
    def lookahead_steps(self) -> dict[int, int]:
        """Decode steps run so far per K (0 = plain), for benchmarks and examples."""
        return dict(self._lookahead_steps)

    @property
    def tokens_per_row_step(self) -> dict[int, int]:
        """Row-steps so far per number of tokens a row committed in one decode step."""
        return dict(self._tokens_per_row_step)

    @property
    def memory_peaks(self) -> MemoryPeaks:
        """KV memory at its peak so far, against what a rectangular cache would have taken."""
        return dataclasses.replace(self._memory)

    def generate(
        self,
        requests: Sequence[GenerationRequest],
        mode: str = "speculative",
        on_step: Callable[[dict[int, list[int]]], None] | None = None,
        is_cancelled: Callable[[int], bool] | None = None,
        on_finished: Callable[[int, GenerationResult], None] | None = None,
    ) -> list[GenerationResult]:
        """Submit every request and wait for all; results in request order.

        ``on_step({i: ids})`` is called once per engine step with the new tokens of this
        call's rows; ``is_cancelled(i)`` is asked after each step and cancels the row;
        ``on_finished(i, result)`` hands over each row the step it finishes."""
        sink = BatchSink(len(requests), on_step, on_finished, is_cancelled)
        if not requests:
            return []
        sink.bind(self.cancel, self.submit_many(requests, sink, mode))
        return sink.wait()

    def score_choices(self, prompts: Sequence[str], labels: Sequence[Sequence[str]]) -> list[ChoiceScores]:
        """For each prompt, the label the target finds most likely right after it (one prefill),
        on the caller's thread; :meth:`submit_scoring` runs the same inside the loop."""
        with torch.inference_mode():
            return score_choices(self.pair, prompts, labels)

    def submit_scoring(self, prompt: str, labels: Sequence[str], on_done: ScoringDone) -> None:
        """Queue a prefill-only row: the loop scores it between two steps, batched with the
        other scoring rows of that iteration, and calls ``on_done(scores, error)`` there.

        Scoring on the loop keeps one thread on the device and makes a served instance's
        step time include the scoring it does. A row that cannot be scored raises
        UnrunnableRequestError here, so it never fails the others scored beside it."""
        check_scoring_row(self.pair, prompt, labels)
        with self._wake:
            self._incoming_scoring.append((prompt, tuple(labels), on_done))
            self._ensure_thread()
            self._wake.notify()

    def _prompt_ids(self, request: GenerationRequest) -> list[int]:
        check_sampling_settings(request)
        prompt = request.prompt
        if isinstance(prompt, str):
            ids = self.pair.tokenizer.encode(prompt, add_special_tokens=False)
        else:
            try:
                ids = [int(t) for t in prompt]
            except (TypeError, ValueError):
                raise UnrunnableRequestError("prompt must be a string or a sequence of token ids") from None
            bad = [t for t in ids if not 0 <= t < self.pair.vocab_size]
            if bad:
                raise UnrunnableRequestError(
                    f"prompt token ids out of range [0, {self.pair.vocab_size}): {bad[:5]}"
                )
        if not ids:
            raise UnrunnableRequestError("the prompt is empty")
        for name, tokens in (
            ("stop_token_ids", request.stop_token_ids),
            ("logit_bias", [token for token, _ in request.logit_bias]),
        ):
            unknown = [t for t in tokens if not 0 <= t < self.pair.vocab_size]
            if unknown:
                raise UnrunnableRequestError(
                    f"{name}: token ids out of this model's range [0, {self.pair.vocab_size}): {unknown[:5]}"
                )
        total = len(ids) + request.max_new_tokens
        if total > self.pair.max_context:
            raise UnrunnableRequestError(
                f"prompt ({len(ids)} tokens) + max_new_tokens ({request.max_new_tokens}) = {total} "
                f"exceeds the model context of {self.pair.max_context} tokens"
            )
        needed = self.pool.blocks_for(total + MAX_LOOKAHEAD)
        if needed > self.pool.num_blocks:
            raise UnrunnableRequestError(
                f"prompt + max_new_tokens need {needed} KV blocks; this instance's pool has "
                f"{self.pool.num_blocks}"
            )
        return ids

    # ---- the loop ---------------------------------------------------------------------

    def _loop(self) -> None:
        """Run iterations while there is work; the thread ends when idle and the next
        submission starts a new one (an idle engine holds no thread)."""
        with torch.inference_mode():
            if not self._calibrated:
                self._calibrated = True
                if self.lookahead.name == "goodput":
                    try:
                        self.runner.calibrate()
                    except Exception:  # the fit then starts from the first real steps
                        logger.exception("cost calibration failed")
            while True:
                with self._wake:
                    incoming, self._incoming = self._incoming, []
                    scoring, self._incoming_scoring = self._incoming_scoring, []
                    cancels, self._cancel_requests = self._cancel_requests, set()
                    idle = not (incoming or scoring or cancels or self._running or self._waiting)
                    if idle:
                        self._thread = None
                        self._last_commit_at = None
                        return
                self._waiting.extend(incoming)
                if scoring:
                    self._score(scoring)
                try:
                    self._iterate(cancels)
                except Exception as exc:  # a fault fails the rows it touched, never the loop
                    logger.exception("engine step failed")
                    self._fail_all(f"engine step failed: {exc}")
                self._snapshot = self._take_snapshot()
                if self._told is not None:
                    step, rest = self._told
                    self._told = None
                    try:
                        self._record_step(step, rest)
                    except Exception:  # the policy learns nothing from this step; rows are unharmed
                        logger.exception("recording a step failed")

    def _score(self, scoring: list[tuple[str, tuple[str, ...], ScoringDone]]) -> None:
        """Score this iteration's prefill-only rows in one pass; a failure fails them alone."""
        try:
            scores = score_choices(
                self.pair, [p for p, _, _ in scoring], [labels for _, labels, _ in scoring]
            )
        except Exception as exc:
            logger.exception("scoring %d rows failed", len(scoring))
            for _, _, on_done in scoring:
                _call(on_done, None, f"scoring failed: {exc}")
            return
        for (_, _, on_done), score in zip(scoring, scores, strict=True):
            _call(on_done, score, "")

    def _iterate(self, cancels: set[int]) -> None:
        started = time.perf_counter()
        if self.step_hook is not None:
            self.step_hook()
        begun = time.perf_counter()
        self._drop_cancelled_and_expired(cancels)
        self._admit()
        if not self._running:
            self._last_commit_at = None
            return
        speculating = self.lookahead.k > 0
        prefilled_before = self.runner.prefilled_tokens
        self._prefill(catch_up=speculating)
        prefill_seconds = time.perf_counter() - begun
        committed, step = self._decode(caught_up=speculating)
        if committed:
            self._deliver(committed)
            ended = time.perf_counter()
            elapsed = ended - started
            tokens = sum(len(t) for t in committed.values())
            prefilled = self.runner.prefilled_tokens - prefilled_before
            longest = max(row.seq_len for row in committed)
            self._batch_steps.record(len(committed), tokens, prefilled, elapsed, len(committed) * longest)
            cycle = ended - (started if self._last_commit_at is None else self._last_commit_at)
            self._last_commit_at = ended
            per_row = tokens / len(committed)
            self._tokens_per_row = per_row
            self._step_seconds = _smooth(self._step_seconds, elapsed)
            self._step_seconds_total += elapsed
            self._cycle_seconds_total += cycle
            self._seconds_per_token = _smooth(self._seconds_per_token, cycle / per_row)
            if step is not None:  # told once the load a caller woken by the delivery reads is taken
                self._told = (step, ended - begun - prefill_seconds - step.timed)

    def _drop_cancelled_and_expired(self, cancels: set[int]) -> None:
        now = time.monotonic()
        for queue in (self._running, self._waiting):
            for row in list(queue):
                if row.handle.row_id in cancels:
                    self._finish(row, "cancelled")
                elif row.request.deadline is not None and row.request.deadline <= now:
                    self._finish(row, "deadline")

    def _admit(self) -> None:
        if self.batching == "static" and self._running:
            return
        watermark = max(1, self.pool.num_blocks // 100)
        while self._waiting and len(self._running) < self.max_rows:
            row = self._waiting[0]
            hit = self.prefixes.match(row)
            # shared blocks cost nothing new, but an evictable one leaves the free count
            need = self.pool.blocks_for(row.seq_len + MAX_LOOKAHEAD) - len(hit.blocks)
            need += self.prefixes.revived(hit)
            reserve = watermark if self._running else 0
            if need + reserve > self.pool.num_free:
                return
            self.prefixes.admit(row, hit)
            row.draft_feed = row.seq_len - row.draft_cached
            row.draft_wanted = self.lookahead.feeds_drafts
            self.pool.grow(row.blocks, row.seq_len + MAX_LOOKAHEAD)
            self._waiting.popleft()
            self._running.append(row)

    def _prefill_budget(self) -> int:
        """Prompt tokens this iteration may prefill: ``prefill_chunk`` for every token a
        decoding row committed in the last step. Prefill keeps pace with decoding: a
        speculative step commits several tokens per row, so rows finish (and their
        successors arrive) that many times faster per step; a fixed chunk per step
        would admit them no faster, and the batch would shrink while prompts queue."""
        return round(self.prefill_chunk * self._tokens_per_row)

    def _prefill(self, catch_up: bool) -> None:
        """One chunk of prompt for the decoding model; while the policy speculates
        (``catch_up``), one chunk of catch-up for every draft that lags (a row left
        lagging would run a target pass of its own beside every speculative step). The
        draft is not prefilled eagerly: while speculation does not pay (K = 0 under
        load), a prompt costs the target alone, unless the policy wanted the drafts of
        rows admitted then fed all the same (``LookaheadPolicy.feeds_drafts``)."""
        budget = self._prefill_budget()
        for name, modes in (("target", ("speculative", "target_only")), ("draft", ("draft_only",))):
            rows = [r for r in self._running if r.mode in modes and not r.prefilled()]
            if rows and budget > 0:
                budget -= self.runner.prefill(rows, name, budget)
        for row in self._running:
            if row.mode == "speculative":
                self.prefixes.skip_written(row, "draft")
        drafts = [r for r in self._running if r.mode == "speculative" and r.prefilled()]
        self._catch_up(drafts if catch_up else [r for r in drafts if r.draft_wanted])
        for row in self._running:
            self.prefixes.record(row)

    def _catch_up(self, rows: list[Row]) -> None:
        """Feed the lagging drafts among ``rows`` what they missed (one prefill chunk). A
        row admitted while speculating is fed here before any choice sees it; what that
        costs per row, a standing cost of speculating, the policy prices from the rows'
        feeds (:class:`specbatch.decoding.lookahead.DraftFeeds`)."""
        rows = [r for r in rows if _lags(r)]
        if not rows:
            return
        self.runner.clock.drain()  # a timed window around it holds its device time, no more
        self.runner.prefill(rows, "draft", self._prefill_budget(), self._draft_writable_end)
        self.runner.clock.drain()
        for row in rows:
            row.draft_wanted = row.draft_wanted and _lags(row)

    def _draft_writable_end(self, row: Row, start: int, end: int) -> int:
        return self.prefixes.writable_end(row, "draft", start, end)

    def _draft_may_speculate(self, row: Row, k: int) -> bool:
        """The draft of ``row`` may write every slot a K-token speculative step feeds it
        (none of them in a shared block another row is writing)."""
        end = row.seq_len + k - 1
        return self._draft_writable_end(row, row.draft_cached, end) == end

    def _decode(self, caught_up: bool) -> tuple[dict[Row, list[int]], DecodedStep | None]:
        """One decode step over every prefilled row: the committed tokens per row, and
        the step for the policy to be told of once delivered. A choice that switches
        speculation on (the drafts were not ``caught_up`` this iteration) feeds the
        lagging drafts at once, so the step it chose runs now rather than as a plain
        step beside drafts that lag, which would leave the next choice to pay the same
        catch-up again."""
        ready = [r for r in self._running if r.prefilled()]
        speculative = [r for r in ready if r.mode == "speculative"]
        k = self._choose_lookahead(speculative)
        timed_from = time.perf_counter()  # passes and catch-up from here on: not the iteration's rest
        if k > 0 and not caught_up:
            self._catch_up(speculative)
        timed = time.perf_counter() - timed_from
        chosen, k = k, self._make_room(ready, k)
        if k < chosen:
            self._lookahead_cut_steps += 1
        ready = [r for r in ready if r in self._running]  # preemption may have taken some
        spec_rows = [
            r
            for r in ready
            if k > 0 and r.mode == "speculative" and not _lags(r) and self._draft_may_speculate(r, k)
        ]
        plain_target = [r for r in ready if r.mode != "draft_only" and r not in spec_rows]
        draft_only = [r for r in ready if r.mode == "draft_only"]
        self._memory.observe(self._running, self.pool)
        committed: dict[Row, list[int]] = {}
        self._lookahead_steps[k if spec_rows else 0] += 1
        counts: list[int] = []
        # the step is judged against the batch as it stood before it ran: its own
        # outcome must not move the acceptance it is predicted from
        judged, beside = (spec_rows, plain_target) if spec_rows else (plain_target, [])
        shape = self._batch_shape(judged) if judged else None
        beside_shape = self._batch_shape(beside) if beside else None
        drained_from = time.perf_counter()
        self.runner.clock.drain()  # this iteration's prefill is not the step's cost
        started = time.perf_counter()
        timed += started - drained_from
        if spec_rows:
            tokens, counts = self.runner.speculative_step(spec_rows, k)
            committed.update(zip(spec_rows, tokens, strict=True))
            self._acceptance.record(sum(counts), sum(1 for n in counts if n < k))
        if plain_target:
            committed.update(zip(plain_target, self.runner.plain_step(plain_target, "target"), strict=True))
        passes = time.perf_counter() - started
        if draft_only:
            started = time.perf_counter()
            committed.update(zip(draft_only, self.runner.plain_step(draft_only, "draft"), strict=True))
            timed += time.perf_counter() - started
        self._tokens_per_row_step.update(len(t) for t in committed.values())
        if shape is None:
            return committed, None
        step = DecodedStep(
            lookahead=k if spec_rows else 0,
            shape=shape,
            beside_shape=beside_shape,
            rows=len(judged) + len(beside),
            accepted=counts,
            committed=sum(len(committed[r]) for r in judged + beside),
            seconds=passes,
            timed=timed + passes,
        )
        return committed, step

    def _batch_shape(self, rows: list[Row]) -> BatchShape:
        prior, weight = self._acceptance.optimistic_alpha, self._acceptance.row_prior_weight
        measured = self._acceptance.alpha
        return BatchShape(
            alphas=[r.alpha(prior, weight) for r in rows],
            measured_alphas=[r.alpha(measured, weight) for r in rows],
            remaining=[r.remaining for r in rows],
            span=max(r.seq_len for r in rows),
            lags=[r.seq_len - r.draft_cached if _lags(r) else 0 for r in rows],
            rows=[r.handle.row_id for r in rows],
            feeds=[r.draft_feed for r in rows],
            requested=[r.request.max_new_tokens for r in rows],
        )

    def _choose_lookahead(self, rows: list[Row]) -> int:
        if not rows:
            return 0
        k = self.lookahead.choose(self._batch_shape(rows))
        return max(0, min(k, max(r.remaining for r in rows) - 1))

    def _record_step(self, step: DecodedStep, rest: float) -> None:
        """Tell the policy what choosing K delivered, its seconds including ``rest``: the
        iteration's time outside prefill, catch-up and passes (admitting, choosing,
        delivering), which the iteration cost model of the step's kind (speculative or
        plain, :func:`iteration_costs_name`) learns here and every K pays once a step."""
        rest = max(0.0, rest)
        self.runner.costs[iteration_costs_name(step.lookahead)].observe(step.rows, 0, 0, rest)
        self.lookahead.record(
            StepOutcome(
                lookahead=step.lookahead,
                batch=step.shape,
                drafted=step.lookahead * len(step.accepted),
                accepted=sum(step.accepted),
                committed=step.committed,
                seconds=step.seconds + rest,
                beside=step.beside_shape,
            )
        )

    def _make_room(self, rows: list[Row], k: int) -> int:
        """Grow every row to hold this step's tokens: with K if the pool allows, else
        with K = 0, else by preempting the most recently admitted rows."""
        for lookahead in (k, 0) if k else (0,):
            try:
                self._grow_all(rows, lookahead)
                return lookahead
            except OutOfBlocksError:
                continue
        while True:
            victim = self._running[-1]
            self._preempt(victim)
            survivors = [r for r in rows if r in self._running]
            if not survivors:
                return 0
            try:
                self._grow_all(survivors, 0)
                return 0
            except OutOfBlocksError:
                continue

    def _grow_all(self, rows: list[Row], lookahead: int) -> None:
        """All-or-nothing: either every row grows to seq_len + K tokens or none keeps new blocks."""
        grown: list[tuple[Row, int]] = []
        try:
            for row in rows:
                before = len(row.blocks)
                self.pool.grow(row.blocks, row.seq_len + lookahead)
                grown.append((row, before))
        except OutOfBlocksError:
            for row, before in grown:
                extra = row.blocks[before:]
                del row.blocks[before:]
                self.pool.release(extra)
            raise

    def _preempt(self, row: Row) -> None:
        """Free the row's blocks and requeue it at the front; its output is kept and its
        committed tokens are prefilled again when it is readmitted."""
        self._running.remove(row)
        self.prefixes.release(row)
        row.target_cached = row.draft_cached = 0
        row.preemptions += 1
        self._preemptions += 1
        self._waiting.appendleft(row)
        logger.info("preempted row %d (%d tokens) for lack of KV blocks", row.handle.row_id, row.seq_len)

    def _deliver(self, committed: dict[Row, list[int]]) -> None:
        """Apply stop rules, stream the kept tokens per sink, hand over finished rows."""
        by_sink: dict[int, tuple[RowSink, dict[int, list[int]]]] = {}
        done: list[Row] = []
        for row, tokens in committed.items():
            kept = self._stop_rules.extend(row.output, tokens, row.new_logprobs)
            row.new_logprobs = []
            row.tokens.extend(kept)
            self.prefixes.record(row)
            if kept:
                by_sink.setdefault(id(row.sink), (row.sink, {}))[1][row.key] = kept
            if row.output.finish_reason is not None:
                done.append(row)
        for sink, updates in by_sink.values():
            _call(sink.on_tokens, updates)
        for row in done:
            self._finish(row, None)

    def _finish(self, row: Row, reason: str | None, error: str = "") -> None:
        if row in self._running:
            self._running.remove(row)
        elif row in self._waiting:
            self._waiting.remove(row)
        self.prefixes.release(row)
        self._acceptance.row_ended(row.accepted, row.rejections)
        try:
            self._stop_rules.finish(row.output, reason)
        except Exception as exc:  # the row still gets its one final result
            logger.exception("settling row %d failed", row.handle.row_id)
            row.output.finish_reason, row.output.text = "error", ""
            error = error or f"settling the output failed: {exc}"
        result = row.result()
        result.error = error
        _call(row.sink.on_finished, row.key, result)

    def _fail_all(self, message: str) -> None:
        for row in [*self._running, *self._waiting]:
            self._finish(row, "error", message)

    def snapshot_now(self) -> InstanceLoad:
        """The load this moment; only from the loop thread (inside a sink callback), where
        it already counts the blocks a finishing row handed back."""
        return self._take_snapshot()

    def _prefill_seconds_per_token(self) -> float:
        """Seconds a prompt token costs to prefill (target, and draft where there is one),
        by the fitted pass costs at a prompt of PREFILL_REFERENCE_TOKENS; 0 before a pass of
        either network has been timed."""
        tokens = PREFILL_REFERENCE_TOKENS
        seconds = sum(
            costs.predict(tokens, tokens, tokens * tokens)
            for name, costs in self.runner.costs.items()
            if name in ("target", "draft") and costs.observations
        )
        return seconds / tokens

    def _take_snapshot(self) -> InstanceLoad:
        prefixes = self.prefixes.stats()
        return InstanceLoad(
            running=len(self._running),
            waiting=len(self._waiting),
            blocks_total=self.pool.num_blocks,
            blocks_free=self.pool.num_free,
            block_size=self.pool.block_size,
            step_seconds=self._step_seconds,
            step_seconds_total=self._step_seconds_total,
            cycle_seconds_total=self._cycle_seconds_total,
            seconds_per_token=self._seconds_per_token,
            pace_smoothing=STEP_SECONDS_SMOOTHING,
            lookahead=self.lookahead.k,
            lookahead_steps=_counts(self._lookahead_steps, MAX_LOOKAHEAD),
            tokens_per_row_step=_counts(self._tokens_per_row_step, MAX_LOOKAHEAD + 1),
            batch_steps=self._batch_steps.totals(),
            preemptions=self._preemptions,
            lookahead_cut_steps=self._lookahead_cut_steps,
            max_rows=self.max_rows,
            lookahead_slots=MAX_LOOKAHEAD,
            prefill_seconds_per_token=self._prefill_seconds_per_token(),
            prefix_hit_tokens=prefixes.hit_tokens,
            prefix_miss_tokens=prefixes.miss_tokens,
            cached_blocks=prefixes.cached_blocks,
            evictable_blocks=prefixes.evictable_blocks,
            evictions=prefixes.evictions,
        )


def _lags(row: Row) -> bool:
    """The draft misses more than a speculative step's first pass feeds."""
    return row.seq_len - row.draft_cached > MAX_DRAFT_CATCH_UP


def _counts(counter: Counter[int], largest: int) -> tuple[int, ...]:
    """A counter over 0..largest as a tuple indexed by value."""
    return tuple(counter.get(value, 0) for value in range(largest + 1))


def _smooth(previous: float, value: float) -> float:
    return value if previous == 0 else previous + STEP_SECONDS_SMOOTHING * (value - previous)


def _call(callback: Callable, *args) -> None:
    """A sink that raises loses its own update, never the loop."""
    try:
        callback(*args)
    except Exception:
        logger.exception("a row sink raised; the engine goes on")

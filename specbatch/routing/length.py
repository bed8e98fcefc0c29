"""Output-length prediction for the multi-bin scheduler.

The scheduler bins requests by predicted output length, so what matters is the order of
predictions and that each bin keeps about the same share of traffic. A prediction is a
base estimate — a prior per task refined by cues in the instruction (one sentence, a
word or item count, a list, an essay, code, a transformation of the given input) — times
an online correction: the running median of observed/estimated length for that task and
cue class over a recent window. When traffic drifts, the correction follows it, and the
bins' equal-mass boundaries (empirical quantiles of the predictions) follow with it.
"""

from __future__ import annotations

import math
import re
import statistics
import threading
from collections import deque
from collections.abc import Sequence

from .infobench import parse_infobench

DEFAULT_PRIORS = {"graph": 40, "mmlu": 8, "infobench": 320}
# how a row cut before its end teaches the predictor (LengthPredictor.observe)
CUT_ROWS = ("lower_bounds", "skipped")
CHARS_PER_TOKEN = 4.0

_NUMBER_WORDS = {
    "a": 1, "an": 1, "one": 1, "single": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6,
    "seven": 7, "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "fifteen": 15, "twenty": 20,
}
_AMOUNT = r"(\d{1,4}|" + "|".join(_NUMBER_WORDS) + r")"
_WORDS = re.compile(rf"\b{_AMOUNT}[\s-]+words?\b", re.IGNORECASE)
_SENTENCES = re.compile(rf"\b{_AMOUNT}[\s-]+(?:short\s+|brief\s+|concise\s+)?sentences?\b", re.IGNORECASE)
_PARAGRAPHS = re.compile(rf"\b{_AMOUNT}[\s-]+(?:short\s+)?paragraphs?\b", re.IGNORECASE)
_ITEMS = re.compile(
    r"\b(\d{1,3}|" + "|".join(w for w, n in _NUMBER_WORDS.items() if n > 1) + r")\s+(?:\w+\s+){0,2}"
    r"(?:tips|ideas|examples|reasons|ways|items|steps|questions|names|"
    r"bullet\s+points|points|facts|suggestions|strategies|benefits|things|options|titles|"
    r"slogans|headlines|taglines|recommendations|activities|places|books|movies)\b",
    re.IGNORECASE,
)
_CUES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("code", re.compile(
        r"\b(?:python|javascript|java|c\+\+|sql|html|css|bash|regex|code|function|program|script|"
        r"algorithm|class\s+that|implement)\b", re.IGNORECASE)),
    ("transform", re.compile(
        r"\b(?:translate|rewrite|paraphrase|rephrase|convert|proofread|correct\s+the|fix\s+the|"
        r"edit\s+the|reformat|format\s+the)\b", re.IGNORECASE)),
    ("summary", re.compile(r"\b(?:summari[sz]e|summary|tl;?dr)\b", re.IGNORECASE)),
    ("essay", re.compile(
        r"\b(?:essay|article|blog\s+post|story|report|cover\s+letter|speech|research\s+proposal|"
        r"detailed\s+guide|chapter)\b", re.IGNORECASE)),
    ("short", re.compile(
        r"\b(?:classify|categori[sz]e|yes\s+or\s+no|true\s+or\s+false|one\s+word|title|headline|"
        r"slogan|tagline|name\s+for|sentiment|which\s+one)\b", re.IGNORECASE)),
    ("list", re.compile(r"\b(?:list|bullet|enumerate|brainstorm|outline)\b", re.IGNORECASE)),
)
_CUE_ESTIMATES = {"code": 380.0, "summary": 120.0, "essay": 650.0, "short": 20.0, "list": 220.0}
_TOP_PATHS = re.compile(r"\btop[\s-]*(\d+)\b|\b(\d+)\s+shortest\b", re.IGNORECASE)


def _count(token: str) -> int:
    return _NUMBER_WORDS.get(token.lower()) or int(token)


def _estimate_tokens(text: str) -> float:
    return len(text) / CHARS_PER_TOKEN


def instruction_cue(instruction: str, given_input: str) -> tuple[str, float]:
    """The cue class of an open instruction and the base length estimate it implies (tokens)."""
    words = _WORDS.search(instruction)
    if words:
        return "word_count", 1.4 * _count(words.group(1)) + 5
    sentences = _SENTENCES.search(instruction)
    if sentences:
        return "sentence_count", 28.0 * _count(sentences.group(1)) + 4
    paragraphs = _PARAGRAPHS.search(instruction)
    if paragraphs:
        return "paragraph_count", 110.0 * _count(paragraphs.group(1))
    items = _ITEMS.search(instruction)
    if items:
        return "item_count", 28.0 * _count(items.group(1)) + 15
    for cue, pattern in _CUES:
        if pattern.search(instruction):
            if cue == "transform":
                return cue, 1.15 * _estimate_tokens(given_input or instruction) + 10
            if cue == "summary" and given_input:
                return cue, min(_CUE_ESTIMATES[cue], 0.35 * _estimate_tokens(given_input) + 20)
            return cue, _CUE_ESTIMATES[cue]
    return "none", float(DEFAULT_PRIORS["infobench"])


class LengthPredictor:
    """Predicts output tokens per prompt; learns from observed lengths. Thread-safe.

    ``window`` observations per (task, cue class) feed the running median correction;
    ``shrinkage`` observations' worth of weight keep the prior until data accumulates;
    ``cut_rows``: how a row cut before its end is learned (:data:`CUT_ROWS`, see
    :meth:`observe`).
    """

    def __init__(
        self,
        priors: dict[str, int] | None = None,
        *,
        window: int = 512,
        shrinkage: float = 8.0,
        max_tokens: int = 8192,
        cut_rows: str = "lower_bounds",
    ) -> None:
        if window < 1 or shrinkage < 0 or max_tokens < 1:
            raise ValueError("window and max_tokens must be >= 1 and shrinkage >= 0")
        if cut_rows not in CUT_ROWS:
            raise ValueError(f"cut_rows must be one of {', '.join(CUT_ROWS)}, got {cut_rows!r}")
        self.cut_rows = cut_rows
        self.priors = {**DEFAULT_PRIORS, **(priors or {})}
        self.window = window
        self.shrinkage = shrinkage
        self.max_tokens = max_tokens
        self._lock = threading.Lock()
        self._log_ratios: dict[tuple[str, str], deque[float]] = {}
        self._corrections: dict[tuple[str, str], float] = {}
        self._observed: dict[str, deque[int]] = {}

    def base_estimate(self, prompt: str, task: str) -> tuple[str, float]:
        """(cue class, estimate before online correction) for a prompt of a known task."""
        if task == "infobench":
            try:
                parsed = parse_infobench(prompt)
            except ValueError:
                return "none", float(self.priors["infobench"])
            cue, estimate = instruction_cue(parsed.instruction, parsed.input)
            if cue == "none":
                estimate = float(self.priors["infobench"])
            return cue, estimate
        if task == "graph":
            paths = _TOP_PATHS.search(prompt)
            count = int(paths.group(1) or paths.group(2)) if paths else 1
            return "graph", self.priors["graph"] * (0.5 + 0.5 * count)
        if task == "mmlu":
            return "mmlu", float(self.priors["mmlu"])
        raise ValueError(f"unknown task {task!r}; expected one of {', '.join(self.priors)}")

    def predict(self, prompt: str, task: str) -> int:
        """Predicted output tokens, between 1 and ``max_tokens``."""
        cue, estimate = self.base_estimate(prompt, task)
        with self._lock:
            log_correction = self._corrections.get((task, cue), 0.0)
        return max(1, min(self.max_tokens, round(estimate * math.exp(log_correction))))

    def observe(self, prompt: str, task: str, output_tokens: int, *, cut: bool = False) -> None:
        """Record the output length of a finished prompt. A row cut before its end (at its
        max_tokens, a deadline, a cancellation: ``cut``) shows only that its length is at
        least ``output_tokens``: with ``cut_rows="lower_bounds"`` (the default) it is
        learned as a length where that is more than the prediction now (the prediction is
        short by at least that much) and skipped otherwise (it says nothing against the
        prediction); with ``"skipped"`` it is never learned. Learning cut rows as lengths
        would pull predictions down to the clients' caps; skipping them all learns from
        the rows that end early alone, and pulls predictions down towards the shortest
        answers."""
        if output_tokens < 0:
            raise ValueError(f"output_tokens must be >= 0, got {output_tokens}")
        cue, estimate = self.base_estimate(prompt, task)
        log_ratio = math.log(max(1, output_tokens) / max(1.0, estimate))
        key = (task, cue)
        with self._lock:
            if cut and (self.cut_rows == "skipped" or log_ratio <= self._corrections.get(key, 0.0)):
                return
            ratios = self._log_ratios.setdefault(key, deque(maxlen=self.window))
            ratios.append(log_ratio)
            weight = len(ratios) / (len(ratios) + self.shrinkage)
            self._corrections[key] = weight * statistics.median(ratios)
            self._observed.setdefault(task, deque(maxlen=self.window)).append(output_tokens)

    def observed_quantiles(self, task: str, probabilities: Sequence[float]) -> list[float] | None:
        """Nearest-rank quantiles of the recent observed lengths of a task, or ``None`` before any."""
        with self._lock:
            observed = sorted(self._observed.get(task, ()))
        if not observed:
            return None
        count = len(observed)
        return [float(observed[min(count - 1, max(0, math.ceil(p * count) - 1))]) for p in probabilities]

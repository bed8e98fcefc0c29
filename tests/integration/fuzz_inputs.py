"""Hypothesis strategies for hostile requests, each drawn with what the server must answer.

A drawn request carries its expectation: the problems it holds, each with the words an
error naming it must contain, whether the problem fails the request as a whole or only
the prompts it touches, and whether Triton 2.51 itself answers it before the pipeline
sees it. The oracle in test_fuzz.py checks the server's answer against that.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from helpers import GRAPH_PROMPT, INFOBENCH_PROMPT, MMLU_PROMPT
from hypothesis import strategies as st

REQUEST, PROMPT, UPSTREAM_JSON, UPSTREAM_COUNT = "request", "prompt", "upstream-json", "upstream-count"
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
# Over the tiny pair's 4096-token context whatever the tokenizer does, and cheap to route.
HUGE_CHARS = 40_000
# Over the scheduler's bytes-per-prompt limit (1 MiB).
OVERSIZED_BYTES = (1 << 20) + 1


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a request: the words that name it, and whom it fails."""

    words: tuple[str, ...]
    scope: str


@dataclass
class Drawn:
    """A request body (HTTP) or tensors (gRPC) and the problems drawn into it."""

    payload: object
    prompts: int
    problems: list[Problem] = field(default_factory=list)

    def scopes(self) -> set[str]:
        return {problem.scope for problem in self.problems}

    def words(self) -> set[str]:
        return {word for problem in self.problems for word in problem.words}


printable_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=120
).filter(lambda text: text.strip())
good_prompt = st.one_of(st.sampled_from([GRAPH_PROMPT, MMLU_PROMPT, INFOBENCH_PROMPT]), printable_text)
wrong_json_types = st.one_of(
    st.booleans(),
    st.none(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.dictionaries(st.text(), st.integers()),
)


@st.composite
def http_bodies(draw: st.DrawFn) -> Drawn:
    """A /generate body: prompts, sampling fields, overrides; each field right, wrong in value
    (the pipeline must refuse it, naming it) or wrong in JSON type (Triton's parser refuses it)."""
    body: dict = {}
    problems: list[Problem] = []
    shape = draw(
        st.sampled_from(["one", "list", "blank", "empty-list", "huge", "oversized", "wrong-type", "missing"])
    )
    count = 1
    if shape == "one":
        body["text_input"] = draw(good_prompt)
    elif shape == "list":
        prompts = draw(st.lists(good_prompt, min_size=1, max_size=3))
        if draw(st.booleans()):
            prompts.insert(draw(st.integers(0, len(prompts))), draw(st.sampled_from(["", " \n\t "])))
            problems.append(Problem(("prompt is empty",), PROMPT))
        body["text_input"], count = prompts, len(prompts)
    elif shape == "blank":
        body["text_input"] = draw(st.sampled_from(["", "   ", "\n\n"]))
        problems.append(Problem(("prompt is empty",), PROMPT))
    elif shape == "empty-list":
        body["text_input"] = []
        problems.append(Problem(("no prompt",), REQUEST))
    elif shape == "huge":
        body["text_input"] = "word " * (HUGE_CHARS // 5)
        problems.append(Problem(("context",), PROMPT))
    elif shape == "oversized":
        body["text_input"] = "w" * OVERSIZED_BYTES
        problems.append(Problem(("bytes",), PROMPT))
    elif shape == "wrong-type":
        body["text_input"] = draw(
            st.one_of(st.integers(), wrong_json_types, st.lists(st.integers(), min_size=1))
        )
        problems.append(Problem(("parse",), UPSTREAM_JSON))

    def number_field(name: str, good, bad, integral: bool, bad_problem: Problem | None = None) -> None:
        choice = draw(st.sampled_from(["omit", "good", "good", "bad", "wrong-type", "list"]))
        if choice == "omit":
            return
        if choice == "good":
            body[name] = draw(good)
        elif choice == "bad":
            body[name] = draw(bad)
            problems.append(bad_problem or Problem((name,), PROMPT))
        elif choice == "list":
            values = draw(st.lists(good, min_size=1, max_size=4))
            body[name] = values
            if len(values) not in (1, count):
                problems.append(Problem((name,), REQUEST))
        else:
            wrong = st.one_of(st.text(max_size=8), st.booleans(), st.none())
            if integral:
                wrong = st.one_of(
                    wrong, st.floats(allow_nan=False, allow_infinity=False).filter(lambda x: x != int(x))
                )
            body[name] = draw(wrong)
            problems.append(Problem(("parse",), UPSTREAM_JSON))

    number_field(
        "max_tokens",
        st.integers(1, 4),
        st.one_of(st.integers(INT32_MIN, 0), st.integers(513, INT32_MAX)),
        True,
    )
    number_field("temperature", st.floats(0, 2), st.floats(-1e30, -1e-6), False)
    number_field(
        "top_p",
        st.floats(1e-6, 1),
        st.one_of(st.just(0.0), st.floats(-1e30, -1e-6), st.floats(1.001, 1e30)),
        False,
    )
    number_field("top_k", st.integers(0, 50), st.integers(INT32_MIN, -1), True)
    number_field("min_p", st.floats(0, 1), st.floats(1.001, 1e30), False)
    number_field("presence_penalty", st.floats(-2, 2), st.floats(2.001, 1e30), False)
    number_field("logprobs", st.integers(-5, 20), st.integers(21, INT32_MAX), True)
    # a negative seed is not an unsigned integer: Triton's JSON parser refuses it (UINT64)
    number_field(
        "random_seed",
        st.integers(0, 2**64 - 1),
        st.integers(-(2**63), -1),
        True,
        Problem(("parse",), UPSTREAM_JSON),
    )
    ignore_eos = draw(st.sampled_from(["omit", "one", "list", "wrong-type"]))
    if ignore_eos == "one":
        body["ignore_eos"] = draw(st.booleans())
    elif ignore_eos == "list":
        body["ignore_eos"] = draw(st.lists(st.booleans(), min_size=1, max_size=4))
        if len(body["ignore_eos"]) not in (1, count):
            problems.append(Problem(("ignore_eos",), REQUEST))
    elif ignore_eos == "wrong-type":
        body["ignore_eos"] = draw(st.one_of(st.integers(), st.text(max_size=8)))
        problems.append(Problem(("parse",), UPSTREAM_JSON))
    if "max_tokens" not in body:
        body["max_tokens"] = 2
    override = draw(st.sampled_from(["omit", "infobench", "unknown", "wrong-type"]))
    if override == "infobench":
        body["task_override"] = "infobench"
    elif override == "unknown":
        body["task_override"] = draw(st.sampled_from(["poetry", "GRAPHS", "sql"]))
        problems.append(Problem(("task override",), PROMPT))
    elif override == "wrong-type":
        body["task_override"] = draw(st.one_of(st.integers(), st.booleans()))
        problems.append(Problem(("parse",), UPSTREAM_JSON))
    if draw(st.integers(0, 9)) == 0:
        body["stream"] = True
        problems.append(Problem(("exactly 1 response",), UPSTREAM_COUNT))
    if draw(st.booleans()):
        body[draw(st.sampled_from(["bogus", "user", "seed"]))] = draw(st.integers(0, 9))
    if shape == "missing":
        problems.append(Problem(("text_input",), REQUEST))
    return Drawn(body, count, problems)


@dataclass(frozen=True)
class Tensor:
    """One input of a gRPC request: name, Triton datatype and array (shape included)."""

    name: str
    datatype: str
    array: np.ndarray

    def __repr__(self) -> str:
        values = repr(self.array.tolist())
        shown = values if len(values) <= 300 else f"{values[:300]}... ({len(values)} chars)"
        return f"Tensor({self.name!r}, {self.datatype}, shape={list(self.array.shape)}, {shown})"


def _bytes_tensor(name: str, values: list[bytes], shape: tuple[int, ...] | None = None) -> Tensor:
    array = np.array(values, dtype=np.object_)
    return Tensor(name, "BYTES", array.reshape(shape or (1, len(values))))


# Faults that replace text_input's datatype or shape: applied after those that change its
# prompts, which rebuild it from them.
SHAPE_FAULTS = ("prompt-dtype", "prompt-1d", "prompt-3d", "batch-2", "no-prompts")
non_utf8 = st.builds(lambda head, tail: head + b"\xff" + tail, st.binary(max_size=16), st.binary(max_size=16))


@st.composite
def grpc_requests(draw: st.DrawFn) -> Drawn:
    """Tensors for the gRPC stream: well-formed ones with one to three faults drawn in: wrong
    datatypes, wrong shapes, unknown inputs, non-UTF-8 bytes, blank or huge prompts, bad values."""
    prompts = [p.encode() for p in draw(st.lists(good_prompt, min_size=1, max_size=3))]
    tensors = {
        "text_input": _bytes_tensor("text_input", prompts),
        "max_tokens": Tensor("max_tokens", "INT32", np.array([[2]], dtype=np.int32)),
    }
    problems: list[Problem] = []
    # A later fault on the same sampling input replaces the earlier one's tensor and problem.
    param_problems: dict[str, Problem] = {}
    faults = draw(
        st.lists(
            st.sampled_from(
                [
                    "none", "prompt-dtype", "prompt-1d", "prompt-3d", "batch-2", "no-prompts",
                    "non-utf8", "blank", "huge", "param-dtype", "param-shape", "param-value",
                    "unknown-input", "chat-history", "stop-words", "exclude-input", "task-override",
                    "no-text-input", "oversized",
                ]
            ),
            min_size=1,
            max_size=3,
            unique=True,
        )
    )  # fmt: skip
    for fault in sorted(faults, key=lambda fault: fault in SHAPE_FAULTS):
        if fault == "prompt-dtype":
            datatype, dtype = draw(
                st.sampled_from([("INT32", np.int32), ("FP32", np.float32), ("BOOL", np.bool_)])
            )
            tensors["text_input"] = Tensor("text_input", datatype, np.ones((1, len(prompts)), dtype=dtype))
            problems.append(Problem(("text_input",), REQUEST))
        elif fault == "prompt-1d":
            tensors["text_input"] = _bytes_tensor("text_input", prompts, (len(prompts),))
            # Triton reads [N] as N batch entries: it may name another input's batch size first.
            problems.append(Problem(("text_input", "batch size"), REQUEST))
        elif fault == "prompt-3d":
            tensors["text_input"] = _bytes_tensor("text_input", prompts, (1, len(prompts), 1))
            problems.append(Problem(("text_input",), REQUEST))
        elif fault == "batch-2":
            tensors["text_input"] = _bytes_tensor("text_input", prompts * 2, (2, len(prompts)))
            problems.append(Problem(("batch",), REQUEST))
        elif fault == "no-prompts":
            tensors["text_input"] = _bytes_tensor("text_input", [], (1, 0))
            problems.append(Problem(("no prompt", "text_input"), REQUEST))
        elif fault == "non-utf8":
            prompts[draw(st.integers(0, len(prompts) - 1))] = draw(non_utf8)
            tensors["text_input"] = _bytes_tensor("text_input", prompts)
            problems.append(Problem(("utf-8",), PROMPT))
        elif fault == "blank":
            prompts[draw(st.integers(0, len(prompts) - 1))] = draw(st.sampled_from([b"", b"  \n"]))
            tensors["text_input"] = _bytes_tensor("text_input", prompts)
            problems.append(Problem(("prompt is empty",), PROMPT))
        elif fault == "huge":
            prompts[draw(st.integers(0, len(prompts) - 1))] = b"word " * (HUGE_CHARS // 5)
            tensors["text_input"] = _bytes_tensor("text_input", prompts)
            problems.append(Problem(("context",), PROMPT))
        elif fault == "oversized":
            prompts[draw(st.integers(0, len(prompts) - 1))] = b"w" * OVERSIZED_BYTES
            tensors["text_input"] = _bytes_tensor("text_input", prompts)
            problems.append(Problem(("bytes",), PROMPT))
        elif fault == "param-dtype":
            name, datatype, dtype = draw(
                st.sampled_from(
                    [("max_tokens", "FP32", np.float32), ("max_tokens", "INT64", np.int64),
                     ("temperature", "INT32", np.int32), ("temperature", "FP64", np.float64),
                     ("top_k", "FP32", np.float32), ("stream", "INT32", np.int32),
                     ("random_seed", "INT64", np.int64), ("ignore_eos", "INT32", np.int32)]
                )
            )  # fmt: skip
            tensors[name] = Tensor(name, datatype, np.ones((1, 1), dtype=dtype))
            param_problems[name] = Problem((name,), REQUEST)
        elif fault == "param-shape":
            tensors["stream"] = Tensor("stream", "BOOL", np.zeros((1, 2), dtype=np.bool_))
            param_problems["stream"] = Problem(("stream",), REQUEST)
        elif fault == "param-value":
            name, value, dtype = draw(
                st.sampled_from(
                    [("max_tokens", 0, np.int32), ("max_tokens", INT32_MAX, np.int32),
                     ("max_tokens", INT32_MIN, np.int32), ("temperature", -1.0, np.float32),
                     ("temperature", float("nan"), np.float32), ("top_p", 0.0, np.float32),
                     ("top_p", float("nan"), np.float32), ("top_p", 1.5, np.float32),
                     ("top_k", -3, np.int32)]
                )
            )  # fmt: skip
            tensors[name] = Tensor(
                name, "INT32" if dtype is np.int32 else "FP32", np.array([[value]], dtype=dtype)
            )
            param_problems[name] = Problem((name,), PROMPT)
        elif fault == "unknown-input":
            name = draw(st.sampled_from(["bogus", "text", "routed_task", "predicted_tokens"]))
            tensors[name] = Tensor(name, "INT32", np.zeros((1, 1), dtype=np.int32))
            problems.append(Problem((name,), REQUEST))
        elif fault == "chat-history":
            tensors["chat"] = Tensor("chat", "BOOL", np.ones((1, 1), dtype=np.bool_))
            history = draw(st.one_of(non_utf8, st.sampled_from([b"{", b"[1]", b'[{"role": "robot"}]'])))
            tensors["chat_history"] = _bytes_tensor("chat_history", [history])
            problems.append(Problem(("chat_history",), PROMPT))
        elif fault == "stop-words":
            tensors["stop_words"] = _bytes_tensor("stop_words", [b"x"] * 17)
            problems.append(Problem(("stop_words",), REQUEST))
        elif fault == "exclude-input":
            tensors["exclude_input_in_output"] = Tensor(
                "exclude_input_in_output", "BOOL", np.zeros((1, 1), dtype=np.bool_)
            )
            problems.append(Problem(("exclude_input_in_output",), REQUEST))
        elif fault == "task-override":
            tensors["task_override"] = _bytes_tensor(
                "task_override", [draw(st.sampled_from([b"poetry", b"\xff"]))]
            )
            problems.append(Problem(("task override",), PROMPT))
    problems += param_problems.values()
    if "no-text-input" in faults:
        # Applied last, whatever the other faults did to text_input: the request has none.
        del tensors["text_input"]
        problems = [problem for problem in problems if problem.scope == REQUEST]
        problems.append(Problem(("text_input",), REQUEST))
    return Drawn(list(tensors.values()), len(prompts), problems)

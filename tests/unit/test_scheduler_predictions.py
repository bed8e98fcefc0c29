"""What the scheduler core teaches its length predictor: the lengths rows ended at by
themselves; of a row cut short (by a client's max_tokens, a deadline, a cancellation), a
lower bound, never a length: it raises a prediction below it and lowers none. The test
plays the instance and reads the predictions the admission policy is given."""

from __future__ import annotations

from pathlib import Path

import pytest
from serving_helpers import RecordingReply, word_target

from specbatch.scheduling.admission import AdmissionConfig, AdmissionPolicy
from specbatch.scheduling.load import InstanceLoad
from specbatch.scheduling.requests import QueuedRequest
from specbatch.serving.messages import RowOutcome, Run
from specbatch.serving.params import RequestError, ServingLimits
from specbatch.serving.scheduler.core import SchedulerCore
from specbatch.serving.scheduler.intake import RequestIntake, RoutedRequest
from specbatch.serving.scheduler.setup import build_core_settings
from specbatch.serving.settings import ConfigError, ModelSettings

INFOBENCH = "Instruction: Name three colours.\nQuestion: \nGeneration:"
IDLE = InstanceLoad(blocks_total=256, blocks_free=256, block_size=16)


class PredictionsSeen(AdmissionPolicy):
    """The server's policy, recording the predicted length of every prompt it queues."""

    def __init__(self) -> None:
        super().__init__(AdmissionConfig())
        self.predicted: list[float] = []

    def enqueue_all(self, requests: list[QueuedRequest]) -> None:
        self.predicted.extend(request.predicted_tokens for request in requests)
        super().enqueue_all(requests)


class Instance:
    def __init__(self) -> None:
        self.runs: list[Run] = []

    def send(self, message) -> None:
        if isinstance(message, Run):
            self.runs.append(message)

    def terminate(self) -> None:
        raise AssertionError("no instance hangs in these tests")


async def no_graphs(text: str) -> str:
    raise AssertionError("no graph prompt in these tests")


def answer_every_request(max_tokens: int, produced: int, finish_reason: str, times: int) -> list[float]:
    """Predictions the policy saw for ``times`` requests of INFOBENCH, then one more at
    max_tokens 64, each answered with ``produced`` tokens ending for ``finish_reason``."""
    return answer_in_turn([(max_tokens, produced, finish_reason)] * times)


def answer_in_turn(answers: list[tuple[int, int, str]]) -> list[float]:
    """Predictions the policy saw for one request of INFOBENCH per answer (its max_tokens,
    then answered with that many tokens produced, ending for that reason), then one more
    at max_tokens 64."""
    policy, instance = PredictionsSeen(), Instance()
    intake = RequestIntake(
        ServingLimits(max_tokens_cap=64, default_max_tokens=8), word_target(256), lambda: 100.0
    )
    core = SchedulerCore(intake, policy, no_graphs, clock=lambda: 100.0)
    core.instance_joined("s", IDLE, instance)
    for max_tokens, produced, finish_reason in answers:
        core.submit(
            RoutedRequest(prompts=(INFOBENCH,), tasks=("infobench",), max_tokens=[max_tokens]),
            RecordingReply(),
        )
        row = instance.runs[-1].rows[0].row
        outcome = RowOutcome(
            "red " * produced, num_output_tokens=produced, finish_reason=finish_reason, instance="s"
        )
        core.instance_done(instance, row, outcome, IDLE)
    core.submit(RoutedRequest(prompts=(INFOBENCH,), tasks=("infobench",), max_tokens=[64]), RecordingReply())
    return policy.predicted


def test_rows_cut_at_max_tokens_do_not_teach_the_predictor_a_length():
    seen = answer_every_request(max_tokens=8, produced=8, finish_reason="length", times=20)
    assert seen[:-1] == [8] * 20  # the cap bounds each prediction
    assert seen[-1] == 64, "twenty rows cut at 8 tokens say nothing against a longer answer"


def test_a_prompt_that_ignores_eos_is_queued_at_its_max_tokens():
    policy, instance = PredictionsSeen(), Instance()
    intake = RequestIntake(
        ServingLimits(max_tokens_cap=64, default_max_tokens=8), word_target(256), lambda: 100.0
    )
    core = SchedulerCore(intake, policy, no_graphs, clock=lambda: 100.0)
    core.instance_joined("s", IDLE, instance)
    for _ in range(20):  # teach the predictor that this prompt's answers are short
        core.submit(
            RoutedRequest(prompts=(INFOBENCH,), tasks=("infobench",), max_tokens=[64]), RecordingReply()
        )
        row = instance.runs[-1].rows[0].row
        outcome = RowOutcome("red", num_output_tokens=3, finish_reason="stop", instance="s")
        core.instance_done(instance, row, outcome, IDLE)
    core.submit(
        RoutedRequest(
            prompts=(INFOBENCH, INFOBENCH), tasks=("infobench",), max_tokens=[48], ignore_eos=[True, False]
        ),
        RecordingReply(),
    )
    ignoring, stopping = policy.predicted[-2:]
    assert ignoring == 48, "no end-of-sequence ends it sooner than its max_tokens"
    assert stopping < 16, "its neighbour keeps the learned prediction"
    started = {work.row: work for work in instance.runs[-1].rows}
    assert sorted(work.ignore_eos for work in started.values()) == [False, True]

    core.submit(
        RoutedRequest(prompts=(INFOBENCH,), tasks=("infobench",), max_tokens=[48], min_tokens=[40]),
        RecordingReply(),
    )
    assert policy.predicted[-1] == 40, "nothing ends it before its min_tokens"
    assert instance.runs[-1].rows[-1].min_tokens == 40

    core.submit(  # TensorRT-LLM's name, as GenAI-Perf sends it for deterministic lengths
        RoutedRequest(prompts=(INFOBENCH,), tasks=("infobench",), max_tokens=[48], min_length=[48]),
        RecordingReply(),
    )
    assert policy.predicted[-1] == 48 and instance.runs[-1].rows[-1].min_tokens == 48
    with pytest.raises(RequestError, match="min_length"):
        core.submit(
            RoutedRequest(prompts=(INFOBENCH,), tasks=("infobench",), min_tokens=[4], min_length=[4]),
            RecordingReply(),
        )


def test_rows_that_ended_by_themselves_do():
    seen = answer_every_request(max_tokens=64, produced=5, finish_reason="stop", times=20)
    assert seen[0] == 64
    assert seen[-1] < 32  # learned: the answers are short


def test_rows_cut_at_max_tokens_past_the_prediction_raise_it():
    taught_short = [(64, 4, "stop")] * 20
    short = answer_in_turn(taught_short)[-1]
    seen = answer_in_turn(taught_short + [(48, 48, "length")] * 40)
    assert short < 16
    assert seen[-1] >= 32, "rows of at least 48 tokens show the prediction of 4 too short"


def test_rows_cut_by_a_deadline_or_a_cancellation_lower_no_prediction():
    taught = [(64, 40, "stop")] * 20
    before = answer_in_turn(taught)[-1]
    after = answer_in_turn(taught + [(64, 2, "deadline"), (64, 1, "cancelled")] * 10)[-1]
    assert after == before, "a row stopped after a token or two is not a short answer"


def test_length_cut_rows_is_read_from_the_config_and_checked():
    def settings(value: str | None) -> ModelSettings:
        parameters = {} if value is None else {"length_cut_rows": {"string_value": value}}
        return ModelSettings({"name": "scheduler", "parameters": parameters}, Path("."), env={})

    assert build_core_settings(settings(None)).cut_rows == "lower_bounds"
    assert build_core_settings(settings("skipped")).cut_rows == "skipped"
    with pytest.raises(ConfigError, match="length_cut_rows"):
        build_core_settings(settings("ignored"))

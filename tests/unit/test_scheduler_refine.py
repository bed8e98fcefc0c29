"""Self-refinement in the scheduler core: an infobench prompt asked to `self_refine` runs a
first generation row, then a refining row on the seed system's prompt, queued through the
admission policy like the draft fallback's second stage; it is answered once, by the
second row, with the counters of both. The test plays the instance itself."""

from __future__ import annotations

import pytest
from serving_helpers import RecordingReply, over_the_wire, word_target

from specbatch.routing import build_infobench_prompt
from specbatch.routing.classify import AMBIGUOUS
from specbatch.scheduling.admission import AdmissionConfig, AdmissionPolicy
from specbatch.scheduling.load import InstanceLoad
from specbatch.serving.messages import GENERATE, SCORE, Cancel, Message, RowOutcome, RowWork, Run
from specbatch.serving.params import RequestError, ServingLimits
from specbatch.serving.scheduler.core import SchedulerCore
from specbatch.serving.scheduler.intake import RequestIntake, RoutedRequest

INFOBENCH = "Instruction: Name three colours.\nQuestion: \nGeneration:"
MMLU = "Question:\nWhich bone is in the arm?\n\nChoices:\nA. Femur\nB. Humerus\nC. Tibia"
UNPLACED = "Here are my options:\nA. speed\nB. cost"  # only the draft model can place it
IDLE = InstanceLoad(blocks_total=256, blocks_free=256, block_size=16)
FULL = InstanceLoad(blocks_total=256, blocks_free=0, block_size=16)  # no room for another row
FIRST = RowOutcome(
    "Red, green.",
    num_input_tokens=7,
    num_output_tokens=4,
    total_draft_tokens=6,
    total_accepted_draft_tokens=3,
    instance="s",
)
REFINED = RowOutcome(
    "Red, green, blue.",
    num_input_tokens=30,
    num_output_tokens=5,
    total_draft_tokens=4,
    total_accepted_draft_tokens=4,
    instance="s",
)


def refining_prompt(question: str, answer: str) -> str:
    """The seed system's refinement prompt, written out to pin it verbatim."""
    return (
        "Provide a refined answer to the question below. Output ONLY the final answer without "
        "showing your reasoning or thought process.\n\n"
        f"Original question:\n{question}\n\nPrevious answer:\n{answer}\n\nRefined answer:"
    )


class ScriptedInstance:
    """One instance connection the test answers itself; what the core sends is recorded."""

    def __init__(self) -> None:
        self.sent: list[Message] = []

    def send(self, message: Message) -> None:
        self.sent.append(over_the_wire(message))

    def terminate(self) -> None:
        raise AssertionError("no instance hangs in these tests")

    def rows(self) -> list[RowWork]:
        return [row for message in self.sent if isinstance(message, Run) for row in message.rows]


async def no_graphs(text: str) -> str:
    raise AssertionError("no graph prompt in these tests")


def make_core(max_context: int = 256) -> SchedulerCore:
    """A core whose target counts whitespace-separated words."""
    intake = RequestIntake(
        ServingLimits(max_tokens_cap=32, default_max_tokens=8), word_target(max_context), lambda: 100.0
    )
    return SchedulerCore(intake, AdmissionPolicy(AdmissionConfig()), no_graphs, clock=lambda: 100.0)


def serve(request: RoutedRequest):
    """A core with one scripted instance, ``request`` submitted to it."""
    core, instance = make_core(), ScriptedInstance()
    core.instance_joined("s", IDLE, instance)
    reply = RecordingReply(refuse_deltas=not request.stream)
    core.submit(request, reply)
    return core, instance, reply


def refined(prompts: tuple[str, ...] = (INFOBENCH,), tasks: tuple[str, ...] = ("infobench",), **options):
    """A request whose prompts all ask for self-refinement, 8 tokens per pass."""
    return RoutedRequest(prompts=prompts, tasks=tasks, max_tokens=[8], self_refine=[True], **options)


def test_the_refining_row_runs_on_the_first_answer_and_answers_with_both_passes_counted():
    core, instance, reply = serve(refined(temperature=[0.5], top_p=[0.9], top_k=[5]))
    [first] = instance.rows()
    assert (first.kind, first.prompt, first.max_tokens) == (GENERATE, build_infobench_prompt(INFOBENCH), 8)

    core.instance_done(instance, first.row, FIRST, FULL)
    assert reply.finals == [], "the first answer is not the answer"
    assert (core.queued, len(instance.rows())) == (1, 1), "the refining prompt waits for admission"

    core.instance_step(instance, (), (), IDLE)
    [_, second] = instance.rows()
    assert second.prompt == refining_prompt(INFOBENCH, "Red, green.")
    assert second.row == first.row, "the same prompt, its second stage"
    same = ("kind", "mode", "max_tokens", "temperature", "top_p", "top_k", "stop", "stream")
    assert [getattr(second, name) for name in same] == [getattr(first, name) for name in same]

    core.instance_done(instance, second.row, REFINED, IDLE)
    [[answer]] = reply.finals
    assert (answer.text, answer.task, answer.finish_reason, answer.error) == (
        "Red, green, blue.",
        "infobench",
        "stop",
        "",
    )
    counters = (answer.num_input_tokens, answer.num_output_tokens, answer.total_draft_tokens)
    assert counters == (7 + 30, 4 + 5, 6 + 4)
    assert answer.total_accepted_draft_tokens == 3 + 4 and answer.acceptance_rate == pytest.approx(0.7)
    assert (core.queued, core.running_rows) == (0, 0)


def test_a_streaming_client_sees_only_the_refined_pass():
    core, instance, reply = serve(refined(stream=True))
    [first] = instance.rows()
    assert first.stream is False, "the first pass is not streamed"
    core.instance_done(instance, first.row, FIRST, IDLE)
    [_, second] = instance.rows()
    assert second.stream is True
    core.instance_step(instance, (second.row,), ((second.row, "Red, ", ""),), IDLE)
    core.instance_done(instance, second.row, REFINED, IDLE)
    assert reply.pieces(0) == ["Red, ", "green, blue."]
    assert [answer.text for answer in reply.finals[0]] == ["Red, green, blue."]


@pytest.mark.parametrize(
    ("request_", "kinds"),
    [
        (RoutedRequest(prompts=[INFOBENCH], tasks=["infobench"], max_tokens=[8]), [GENERATE]),
        (RoutedRequest(prompts=[INFOBENCH], tasks=["infobench"], self_refine=[False]), [GENERATE]),
        (refined((MMLU,), ("mmlu",)), [SCORE]),
    ],
    ids=["left-out", "false", "mmlu"],
)
def test_without_it_or_outside_infobench_a_prompt_runs_one_row(request_, kinds):
    core, instance, reply = serve(request_)
    [row] = instance.rows()
    assert [row.kind] == kinds
    core.instance_done(
        instance, row.row, RowOutcome(" B" if row.kind == SCORE else "Red.", instance="s"), IDLE
    )
    [[answer]] = reply.finals
    assert answer.text == ("The answer is (B)" if row.kind == SCORE else "Red.")
    assert len(instance.rows()) == 1


def test_per_prompt_values_refine_only_the_prompts_that_ask():
    core, instance, reply = serve(
        RoutedRequest(prompts=[INFOBENCH, INFOBENCH], tasks=["infobench"] * 2, self_refine=[False, True])
    )
    plain, asking = instance.rows()
    core.instance_done(instance, plain.row, RowOutcome("Red."), IDLE)
    core.instance_done(instance, asking.row, FIRST, IDLE)
    [_, _, second] = instance.rows()
    assert (second.row, second.prompt) == (asking.row, refining_prompt(INFOBENCH, "Red, green."))
    core.instance_done(instance, second.row, REFINED, IDLE)
    [[one, two]] = reply.finals
    assert (one.text, two.text) == ("Red.", "Red, green, blue.")


def test_self_refine_of_the_wrong_length_refuses_the_request():
    request = RoutedRequest(prompts=[INFOBENCH] * 3, tasks=["infobench"] * 3, self_refine=[True, False])
    with pytest.raises(RequestError, match="'self_refine' has 2 values for 3 prompts"):
        make_core().submit(request, RecordingReply())


def test_a_prompt_placed_by_the_draft_model_is_refined_too():
    core, instance, reply = serve(refined((UNPLACED,), (AMBIGUOUS,)))
    [route] = instance.rows()
    assert route.mode == "draft_only"
    core.instance_done(instance, route.row, RowOutcome("infobench"), IDLE)
    [_, first] = instance.rows()
    core.instance_done(instance, first.row, FIRST, IDLE)
    [_, _, second] = instance.rows()
    assert second.prompt == refining_prompt(UNPLACED, "Red, green.")
    core.instance_done(instance, second.row, REFINED, IDLE)
    [[answer]] = reply.finals
    assert (answer.task, answer.text, answer.num_output_tokens) == ("infobench", "Red, green, blue.", 9)


@pytest.mark.parametrize(
    "first_ends",
    [
        RowOutcome.failed("engine step failed: boom"),
        RowOutcome("Red", finish_reason="deadline", num_output_tokens=1),
        RowOutcome("Red", finish_reason="cancelled", num_output_tokens=1),
    ],
    ids=["error", "deadline", "cancelled"],
)
def test_a_first_pass_that_ends_early_is_the_answer_and_nothing_is_refined(first_ends):
    core, instance, reply = serve(refined())
    [first] = instance.rows()
    core.instance_done(instance, first.row, first_ends, IDLE)
    [[answer]] = reply.finals
    assert (answer.text, answer.num_output_tokens) == (first_ends.text, first_ends.num_output_tokens)
    assert answer.finish_reason == ("error" if first_ends.error else "cancelled")
    assert len(instance.rows()) == 1 and core.queued == 0


def _cancel_queued(core: SchedulerCore, instance: ScriptedInstance, reply: RecordingReply) -> None:
    reply.cancelled = True
    core.poll_cancellations()


def _cancel_running(core: SchedulerCore, instance: ScriptedInstance, reply: RecordingReply) -> None:
    reply.cancelled = True
    core.poll_cancellations()
    [second] = instance.rows()[1:]
    assert instance.sent[-1] == Cancel((second.row,))
    core.instance_done(instance, second.row, RowOutcome("Bl", finish_reason="cancelled", instance="s"), IDLE)


def _deadline(core: SchedulerCore, instance: ScriptedInstance, reply: RecordingReply) -> None:
    [second] = instance.rows()[1:]
    core.instance_done(instance, second.row, RowOutcome("Bl", finish_reason="deadline", instance="s"), IDLE)


def _lost(core: SchedulerCore, instance: ScriptedInstance, reply: RecordingReply) -> None:
    core.instance_lost(instance, "its connection closed")


def _shutdown(core: SchedulerCore, instance: ScriptedInstance, reply: RecordingReply) -> None:
    core.begin_shutdown()
    core.fail_everything("the server is shutting down")


def _loop_fails(core: SchedulerCore, instance: ScriptedInstance, reply: RecordingReply) -> None:
    core.restart(RuntimeError("tick broke"))


@pytest.mark.parametrize(
    ("refining_ends", "load", "reason", "error"),
    [
        (_cancel_queued, FULL, "cancelled", "request cancelled"),
        (_cancel_running, IDLE, "cancelled", "request cancelled"),
        (_deadline, IDLE, "cancelled", "deadline exceeded"),
        (_lost, IDLE, "error", "model instance s failed while running this prompt"),
        (_shutdown, IDLE, "error", "the server is shutting down"),
        (
            _loop_fails,
            FULL,
            "error",
            "the scheduler failed while this prompt was pending (tick broke); retry",
        ),
    ],
    ids=["cancelled-queued", "cancelled-running", "deadline", "instance-lost", "shutdown", "loop-fails"],
)
def test_a_refining_pass_that_cannot_finish_answers_the_request_once(refining_ends, load, reason, error):
    core, instance, reply = serve(refined(stream=True))
    [first] = instance.rows()
    core.instance_done(instance, first.row, FIRST, load)
    if load is IDLE:
        [_, second] = instance.rows()
        core.instance_step(instance, (second.row,), ((second.row, "Bl", ""),), IDLE)  # streamed: no re-run
    refining_ends(core, instance, reply)
    [[answer]] = reply.finals
    assert (answer.finish_reason, answer.error) == (reason, error)
    assert answer.num_output_tokens == FIRST.num_output_tokens, "the first pass's tokens are counted"
    assert answer.instance == "s"
    core.poll_cancellations()
    assert len(reply.finals) == 1 and (core.queued, core.running_rows) == (0, 0)


def test_a_refining_row_whose_instance_dies_before_streaming_runs_again_elsewhere():
    core, instance, reply = serve(refined())
    core.instance_done(instance, instance.rows()[0].row, FIRST, IDLE)
    [_, second] = instance.rows()
    other = ScriptedInstance()
    core.instance_joined("t", IDLE, other)
    core.instance_lost(instance, "its connection closed")
    [again] = other.rows()
    assert again.prompt == second.prompt == refining_prompt(INFOBENCH, "Red, green.")
    core.instance_done(other, again.row, REFINED, IDLE)
    [[answer]] = reply.finals
    assert (answer.text, answer.instance, answer.num_output_tokens) == ("Red, green, blue.", "s", 9)


def test_a_prompt_whose_refining_pass_cannot_fit_the_context_is_refused_before_it_runs():
    # 6 words of prompt + 8 generated fit 40; the refining prompt (32 words) + 2 x 8 do not
    core, instance = make_core(max_context=40), ScriptedInstance()
    core.instance_joined("s", IDLE, instance)
    reply = RecordingReply()
    core.submit(refined(), reply)
    [[answer]] = reply.finals
    assert answer.error == (
        "self_refine: the refining prompt is 32 tokens before the first answer; with max_tokens=8 "
        "for each pass it needs 48, over the model context of 40 tokens"
    )
    assert instance.rows() == []


def test_a_first_answer_that_outgrows_the_context_fails_the_prompt_with_its_counters():
    # fits as planned (32 + 2 x 8 = 48), but an answer of 10 words makes the refining prompt 42
    core, instance = make_core(max_context=48), ScriptedInstance()
    core.instance_joined("s", IDLE, instance)
    reply = RecordingReply()
    core.submit(refined(), reply)
    long_answer = RowOutcome(" ".join("abcdefghij"), num_output_tokens=8, instance="s")
    core.instance_done(instance, instance.rows()[0].row, long_answer, IDLE)
    [[answer]] = reply.finals
    assert answer.error == (
        "self_refine: the refining prompt is 42 tokens; with max_tokens=8 it needs 50, "
        "over the model context of 48 tokens"
    )
    assert (answer.task, answer.num_output_tokens, answer.instance) == ("infobench", 8, "s")
    assert len(instance.rows()) == 1

"""The scheduler core end to end: requests in, rows out to instance runners on real engines
(tiny pair) behind fake connections, answers back through the reply."""

from __future__ import annotations

import pytest
from serving_fixtures import IDLE_LOAD, LONG_ROW_TOKENS, run_cluster
from transformers import AutoTokenizer

from specbatch.decoding import GenerationRequest
from specbatch.routing import (
    LengthPredictor,
    build_fallback_prompt,
    format_mmlu_answer,
    infobench_chat_content,
    route_evidence,
    solve_graph,
)
from specbatch.routing.classify import AMBIGUOUS, DEFAULT_TASK
from specbatch.scheduling.admission import AdmissionConfig
from specbatch.scheduling.load import InstanceLoad
from specbatch.scheduling.prefixes import prefix_keys
from specbatch.serving.latency import PromptTiming
from specbatch.serving.messages import GENERATE, SCORE, Cancel, Done, RowOutcome, RowWork, Run
from specbatch.serving.router.routing import PromptRouter
from specbatch.serving.scheduler.core import Overloaded, SchedulerEvents
from specbatch.serving.scheduler.intake import RoutedRequest
from specbatch.serving.scheduler.tasks import parse_task, prepare_prompt
from specbatch.triton.outputs import outcome_arrays
from specbatch.triton.strings import texts

GRAPH = (
    "You are given a directed graph with 3 nodes (numbered 0 to 2) and the following edges:\n"
    "Edges (source -> target, weight):\n0 -> 1, weight: 2\n1 -> 2, weight: 3\n0 -> 2, weight: 9\n"
    "Find the top 2 shortest path(s) from node 0 to node 2.\n"
    "Answer with submit_paths(paths=[[...], ...], weights=[...])."
)
MMLU = "Question:\nWhich organ produces insulin?\n\nChoices:\nA. Liver\nB. Pancreas\nC. Kidney"
INFOBENCH = "Instruction: Describe a lighthouse.\nQuestion: \nGeneration:"
OTHER = "Instruction: Name three rivers.\nQuestion: \nGeneration:"
# Lettered options with nothing asking to choose: only the draft model can place it.
UNPLACED = "Here are my options:\nA. speed\nB. cost"


def routed(prompts: list[str], max_tokens: list[int], **options) -> RoutedRequest:
    """The request as the router stage hands it on."""
    routes = PromptRouter().route(prompts)
    assert not any(route.error for route in routes)
    return RoutedRequest(
        prompts=prompts,
        tasks=[route.task for route in routes],
        max_tokens=max_tokens,
        **options,
    )


def greedy_text(engine, source: str, max_tokens: int) -> str:
    prompt = prepare_prompt(source, "infobench").model_prompt
    return engine.generate([GenerationRequest(prompt, max_new_tokens=max_tokens)], mode="target_only")[0].text


def mmlu_answer(engine, source: str) -> str:
    prepared = prepare_prompt(source, "mmlu")
    [scores] = engine.score_choices([prepared.model_prompt], [prepared.continuations])
    return format_mmlu_answer(prepared.labels[prepared.continuations.index(scores.best)])


def rows_sent(cluster, name: str) -> list[RowWork]:
    return [row for message in cluster.received[name] if isinstance(message, Run) for row in message.rows]


class Recorder(SchedulerEvents):
    def __init__(self) -> None:
        self.settled_timings: list[list[PromptTiming]] = []
        self.rejected_prompts: list[int] = []
        self.lost: list[str] = []
        self.requeued_prompts: list[int] = []
        self.restarted_instances: list[str] = []

    def settled(self, outcomes, timings) -> None:
        self.settled_timings.append(timings)

    def rejected(self, prompts) -> None:
        self.rejected_prompts.append(prompts)

    def instance_lost(self, instance) -> None:
        self.lost.append(instance)

    def requeued(self, prompts) -> None:
        self.requeued_prompts.append(prompts)

    def instance_restarted(self, instance) -> None:
        self.restarted_instances.append(instance)


def test_a_mixed_request_is_answered_once_in_order_naming_the_instance_of_each_model_row(
    tiny_pair, reference, tiny_pair_dir
):
    async def scenario(cluster):
        cluster.join("i0")
        reply = cluster.submit(routed([GRAPH, MMLU, INFOBENCH], max_tokens=[12]))
        outcomes = await cluster.answer(reply)

        assert [o.task for o in outcomes] == ["graph", "mmlu", "infobench"]
        assert [o.error for o in outcomes] == ["", "", ""]
        assert (
            outcomes[0].text
            == solve_graph(GRAPH)
            == "submit_paths(paths=[[0, 1, 2], [0, 2]], weights=[5, 9])"
        )
        assert outcomes[1].text == mmlu_answer(reference, MMLU)
        assert outcomes[2].text == greedy_text(reference, INFOBENCH, 12)
        assert outcomes[2].num_output_tokens == 12 and outcomes[2].total_draft_tokens > 0
        assert texts(outcome_arrays(outcomes)["model_instance"]) == ["", "i0", "i0"]
        assert sorted((row.kind, row.mode) for row in rows_sent(cluster, "i0")) == [
            (GENERATE, "speculative"),
            (SCORE, "speculative"),
        ], "the graph never reaches an instance"
        assert reply.finals == [outcomes] and reply.deltas == [], "answered once, nothing streamed"
        assert cluster.core.queued == 0

    run_cluster(tiny_pair, tiny_pair_dir, scenario)


def test_every_prompt_is_answered_as_the_engine_alone_would_over_two_instances(
    tiny_pair, reference, tiny_pair_dir
):
    prompts = [f"Instruction: Describe item {i}.\nQuestion: \nGeneration:" for i in range(10)] + [MMLU, MMLU]
    budgets = [6 + i % 3 for i in range(10)] + [1, 1]

    async def scenario(cluster):
        cluster.join("i0")
        cluster.join("i1")
        outcomes = await cluster.answer(cluster.submit(routed(prompts, max_tokens=budgets)))

        assert [o.text for o in outcomes[:10]] == [
            greedy_text(reference, p, n) for p, n in zip(prompts[:10], budgets[:10], strict=True)
        ]
        assert all(o.task == "infobench" and o.total_draft_tokens > 0 for o in outcomes[:10])
        assert outcomes[10].text == outcomes[11].text == mmlu_answer(reference, MMLU)
        assert outcomes[10].text.startswith("The answer is (")
        assert {o.instance for o in outcomes} <= {"i0", "i1"} and all(o.instance for o in outcomes)
        rows = rows_sent(cluster, "i0") + rows_sent(cluster, "i1")
        assert len(rows) == len({row.row for row in rows}) == 12, "each prompt runs once, as a row of its own"

    run_cluster(tiny_pair, tiny_pair_dir, scenario)


def test_streamed_deltas_add_up_to_the_final_text_of_every_prompt(tiny_pair, reference, tiny_pair_dir):
    events = Recorder()

    async def scenario(cluster):
        cluster.join("i0")
        reply = cluster.submit(routed([INFOBENCH, GRAPH, OTHER], max_tokens=[20], stream=True))
        outcomes = await cluster.answer(reply)

        assert [o.text for o in outcomes] == [
            greedy_text(reference, INFOBENCH, 20),
            solve_graph(GRAPH),
            greedy_text(reference, OTHER, 20),
        ]
        for index, outcome in enumerate(outcomes):
            assert reply.streamed(index) == outcome.text
            assert reply.tasks_streamed(index) == {outcome.task}
        assert reply.pieces(1) == [solve_graph(GRAPH)], "a solved graph streams in one delta"
        assert len(reply.pieces(0)) > 1 and len(reply.pieces(2)) > 1, "model text arrives piece by piece"
        assert all(row.stream for row in rows_sent(cluster, "i0"))
        [timings] = events.settled_timings
        assert [t.output_tokens for t in timings] == [20, 0, 20]
        assert timings[0].ttft_s is not None and timings[2].ttft_s is not None

    run_cluster(tiny_pair, tiny_pair_dir, scenario, events=events)


def test_a_prompt_only_the_draft_can_place_runs_a_draft_row_then_its_task(tiny_pair, tiny_pair_dir):
    [route] = PromptRouter().route([UNPLACED])
    assert route.task == AMBIGUOUS

    async def scenario(cluster):
        cluster.join("i0")
        reply = cluster.submit(routed([UNPLACED], max_tokens=[8]))
        [outcome] = await cluster.answer(reply)

        rows = rows_sent(cluster, "i0")
        draft = rows[0]
        assert (draft.kind, draft.mode, draft.max_tokens) == (GENERATE, "draft_only", 4)
        assert draft.prompt == build_fallback_prompt(UNPLACED)
        # the placed row runs under the same id (its prompt's): the draft's answer came first
        [draft_done, placed_done] = [m for m in cluster.reported["i0"] if isinstance(m, Done)]
        assert draft_done.row == placed_done.row == draft.row
        answer = draft_done.outcome.text
        candidates = route_evidence(UNPLACED).candidates
        chosen = parse_task(answer)
        expected = chosen if chosen in candidates else DEFAULT_TASK
        assert outcome.task == expected and expected in candidates
        [placed] = rows[1:]
        assert placed.row == draft.row and placed.mode == "speculative"
        assert placed.prompt == prepare_prompt(UNPLACED, expected).model_prompt
        assert outcome.error == "" and outcome.instance == "i0"
        if expected == "infobench":
            assert placed.kind == GENERATE and outcome.num_output_tokens == 8
        else:
            assert placed.kind == SCORE and outcome.text.startswith("The answer is (")

    run_cluster(tiny_pair, tiny_pair_dir, scenario)


def test_a_lost_instance_s_unstreamed_row_is_requeued_and_completes_elsewhere(
    tiny_pair, reference, tiny_pair_dir
):
    events = Recorder()

    async def scenario(cluster):
        cluster.join("a", dies_before_finishing=True)
        reply = cluster.submit(routed([INFOBENCH], max_tokens=[16]))
        await cluster.until(cluster.started("a"), "the row to start on a")
        cluster.lose("a")
        assert reply.finals == [] and cluster.core.queued == 1, "re-queued, not answered"

        cluster.join("b")
        [outcome] = await cluster.answer(reply)
        assert (outcome.instance, outcome.error, outcome.finish_reason) == ("b", "", "length")
        assert outcome.text == greedy_text(reference, INFOBENCH, 16)
        assert [row.prompt for row in rows_sent(cluster, "b")] == [
            row.prompt for row in rows_sent(cluster, "a")
        ]
        assert events.lost == ["a"] and events.requeued_prompts == [1]
        assert cluster.core.held == 0

    run_cluster(tiny_pair, tiny_pair_dir, scenario, events=events)


def test_a_streamed_row_whose_instance_is_lost_is_answered_with_an_error_naming_it(tiny_pair, tiny_pair_dir):
    async def scenario(cluster):
        cluster.join("a", dies_before_finishing=True)
        reply = cluster.submit(routed([INFOBENCH], max_tokens=[200], stream=True))
        await cluster.until(lambda: bool(reply.streamed(0)), "text to stream")
        streamed = reply.streamed(0)
        cluster.lose("a")

        [outcome] = await cluster.answer(reply)
        assert outcome.finish_reason == "error"
        assert outcome.error == "model instance a failed while running this prompt"
        assert reply.streamed(0) == streamed, "nothing more is streamed after the loss"
        assert cluster.core.queued == 0 and cluster.core.held == 0

    run_cluster(tiny_pair, tiny_pair_dir, scenario)


def test_a_reloaded_instance_s_old_connection_finishes_its_rows_and_gets_no_new_work(tiny_pair_dir):
    events = Recorder()

    async def scenario(cluster):
        old = cluster.join_scripted("s")
        first = cluster.submit(routed([INFOBENCH], max_tokens=[8]))
        [row] = rows_sent(cluster, "s")
        new = cluster.join_scripted("s")  # the model was reloaded: same name, new connection
        assert cluster.core.queued == 0 and first.finals == [], "the running row stays where it is"

        second = cluster.submit(routed([OTHER], max_tokens=[8]))
        assert len(cluster.received["s"]) == 2
        cluster.core.instance_done(old, row.row, RowOutcome(text="old", instance="s"), IDLE_LOAD)
        assert [o.text for o in first.finals[0]] == ["old"]

        cluster.core.instance_lost(old, "its connection closed")  # the old instance unloads
        assert events.lost == [] and events.restarted_instances == []
        [newer] = [r for m in cluster.received["s"][1:] for r in m.rows]
        cluster.core.instance_done(new, newer.row, RowOutcome(text="new", instance="s"), IDLE_LOAD)
        assert [o.text for o in second.finals[0]] == ["new"]

    run_cluster(None, tiny_pair_dir, scenario, events=events)


def test_a_hung_instance_is_ended_and_its_unstreamed_rows_run_elsewhere(tiny_pair_dir):
    now = [100.0]
    events = Recorder()

    async def scenario(cluster):
        hung = cluster.join_scripted("h")
        now[0] += 100.0  # idle for long: no step reports, and none are due
        cluster.core.check_hung()
        reply = cluster.submit(routed([INFOBENCH], max_tokens=[8]))
        [row] = rows_sent(cluster, "h")
        cluster.core.check_hung()
        assert cluster.terminated == [], "silence while idle is not a hang"
        now[0] += 29.0
        cluster.core.instance_step(hung, [], [], IDLE_LOAD)  # progress: not hung
        now[0] += 29.0
        cluster.core.check_hung()
        assert cluster.terminated == [] and events.lost == []

        now[0] += 2.0  # 31 s without a step while running a row
        cluster.core.check_hung()
        assert cluster.terminated == ["h"] and events.lost == ["h"]
        assert cluster.core.queued == 1 and reply.finals == []

        healthy = cluster.join_scripted("b")
        [again] = rows_sent(cluster, "b")
        assert again.prompt == row.prompt
        cluster.core.instance_done(hung, row.row, RowOutcome(text="late"), IDLE_LOAD)
        cluster.core.instance_done(healthy, again.row, RowOutcome(text="fine", instance="b"), IDLE_LOAD)
        assert [(o.text, o.instance) for o in reply.finals[0]] == [("fine", "b")], "one answer, the new one"

        cluster.join_scripted("h")
        assert events.restarted_instances == ["h"]

    run_cluster(None, tiny_pair_dir, scenario, events=events, clock=lambda: now[0], hang_after_s=30.0)


def test_a_request_over_the_queue_limit_is_refused_whole(tiny_pair, tiny_pair_dir):
    events = Recorder()

    async def scenario(cluster):
        first = cluster.submit(routed([INFOBENCH, OTHER], max_tokens=[4]))
        refused = cluster.reply()
        request = routed([GRAPH, INFOBENCH], max_tokens=[4])
        request = RoutedRequest(
            prompts=[*request.prompts, "x"],
            tasks=[*request.tasks, ""],
            route_errors=["", "", "prompt is empty"],
            max_tokens=[4],
        )
        with pytest.raises(Overloaded, match="overloaded"):
            cluster.core.submit(request, refused)
        assert cluster.core.queued == 2 and events.rejected_prompts == [3]

        cluster.join("i0")
        await cluster.answer(first)
        later = await cluster.answer(cluster.submit(routed([GRAPH], max_tokens=[4])))
        assert later[0].text == solve_graph(GRAPH)
        assert refused.finals == [] and refused.deltas == [], "nothing of a refused request is answered"
        assert len(rows_sent(cluster, "i0")) == 2
        assert cluster.core.held == 0, "nothing of a refused request is held"

    run_cluster(tiny_pair, tiny_pair_dir, scenario, queue_limit=2, events=events)


def test_a_cancelled_request_is_answered_cancelled_queued_or_running(tiny_pair, tiny_pair_dir):
    async def scenario(cluster):
        queued = cluster.submit(routed([INFOBENCH, OTHER], max_tokens=[8]))
        queued.cancelled = True
        cluster.core.poll_cancellations()
        [outcomes] = queued.finals
        assert [(o.finish_reason, o.error) for o in outcomes] == [("cancelled", "request cancelled")] * 2
        assert cluster.core.queued == 0

        cluster.join("i0")
        running = cluster.submit(routed([INFOBENCH], max_tokens=[LONG_ROW_TOKENS]))
        untouched = cluster.submit(routed([OTHER], max_tokens=[6]))
        await cluster.until(cluster.started("i0", rows=2), "both rows to start")
        running.cancelled = True
        cluster.core.poll_cancellations()
        [[cancelled_row]] = [m.rows for m in cluster.received["i0"] if isinstance(m, Cancel)]
        [long_row] = [r.row for r in rows_sent(cluster, "i0") if r.max_tokens == LONG_ROW_TOKENS]
        assert cancelled_row == long_row, "only the running row of the cancelled request is withdrawn"

        [cancelled] = await cluster.answer(running)
        assert (cancelled.finish_reason, cancelled.error) == ("cancelled", "request cancelled")
        [fine] = await cluster.answer(untouched)
        assert fine.error == "" and fine.num_output_tokens == 6
        assert cluster.core.held == 0

    run_cluster(tiny_pair, tiny_pair_dir, scenario)


def test_shutdown_answers_every_prompt_still_held(tiny_pair, tiny_pair_dir):
    async def scenario(cluster):
        reply = cluster.submit(routed([INFOBENCH, OTHER], max_tokens=[8]))
        cluster.core.fail_everything("the server is shutting down")
        [outcomes] = reply.finals
        assert {(o.finish_reason, o.error) for o in outcomes} == {("error", "the server is shutting down")}
        assert cluster.core.queued == 0 and cluster.core.held == 0

    run_cluster(tiny_pair, tiny_pair_dir, scenario)


def test_a_prompt_over_the_context_fails_alone_and_keeps_its_task(tiny_pair, tiny_pair_dir):
    async def scenario(cluster):
        cluster.join("i0")
        request = routed([INFOBENCH, "word " * 5000], max_tokens=[8])
        [fine, too_long] = await cluster.answer(cluster.submit(request))
        assert fine.error == "" and fine.task == "infobench"
        assert too_long.task == "infobench" and "over the model context" in too_long.error
        assert too_long == RowOutcome.failed(too_long.error, task="infobench")

    run_cluster(tiny_pair, tiny_pair_dir, scenario)


# ---- with an instance the test plays itself --------------------------------------------


def unplaced(**options) -> RoutedRequest:
    return RoutedRequest(prompts=[UNPLACED], tasks=[AMBIGUOUS], max_tokens=[8], **options)


@pytest.mark.parametrize(
    ("draft_says", "task", "next_kind"),
    [
        (" infobench, it asks for text", "infobench", GENERATE),
        (" graph", "infobench", GENERATE),  # not a candidate for this prompt: the default task
        ("no idea", "infobench", GENERATE),
        (" MMLU.", "mmlu", SCORE),
    ],
)
def test_the_draft_s_answer_picks_the_task_among_the_prompt_s_candidates(
    tiny_pair_dir, draft_says, task, next_kind
):
    async def scenario(cluster):
        cluster.join_scripted("s")
        reply = cluster.submit(unplaced())
        [draft] = rows_sent(cluster, "s")
        assert (draft.mode, draft.max_tokens) == ("draft_only", 4)
        assert draft.prompt == build_fallback_prompt(UNPLACED)
        cluster.core.instance_done(
            cluster.channels["s"], draft.row, RowOutcome(text=draft_says, instance="s"), IDLE_LOAD
        )
        assert reply.finals == []

        prepared = prepare_prompt(UNPLACED, task)
        [_, placed] = rows_sent(cluster, "s")
        assert (placed.kind, placed.prompt) == (next_kind, prepared.model_prompt)
        answer = prepared.continuations[0] if next_kind == SCORE else "ok"
        cluster.core.instance_done(
            cluster.channels["s"], placed.row, RowOutcome(text=answer, instance="s"), IDLE_LOAD
        )
        [[outcome]] = reply.finals
        assert (outcome.task, outcome.instance, outcome.error) == (task, "s", "")
        assert outcome.text == ("The answer is (A)" if next_kind == SCORE else "ok")

    run_cluster(None, tiny_pair_dir, scenario)


def test_a_failed_draft_row_answers_the_prompt_with_its_error(tiny_pair_dir):
    async def scenario(cluster):
        cluster.join_scripted("s")
        reply = cluster.submit(unplaced())
        [draft] = rows_sent(cluster, "s")
        failed = RowOutcome.failed("engine step failed: boom")
        cluster.core.instance_done(cluster.channels["s"], draft.row, failed, IDLE_LOAD)
        [[outcome]] = reply.finals
        assert (outcome.finish_reason, outcome.error) == ("error", "engine step failed: boom")
        assert len(rows_sent(cluster, "s")) == 1

    run_cluster(None, tiny_pair_dir, scenario)


def test_an_unplaced_chat_prompt_keeps_its_chat_format_once_placed(tiny_pair_dir):
    history = '[{"role": "system", "content": "Be brief."}]'
    tokenizer = AutoTokenizer.from_pretrained(tiny_pair_dir / "target")

    async def scenario(cluster):
        cluster.join_scripted("s")
        cluster.submit(unplaced(chat=[True], chat_history=[history]))
        [draft] = rows_sent(cluster, "s")
        cluster.core.instance_done(cluster.channels["s"], draft.row, RowOutcome(text="infobench"), IDLE_LOAD)
        [_, generation] = rows_sent(cluster, "s")
        messages = [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": infobench_chat_content(UNPLACED)},
        ]
        assert generation.prompt == tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, enable_thinking=False
        ), "the placed prompt is rendered with its history, thinking off, no answer prefix"

    run_cluster(None, tiny_pair_dir, scenario)


def test_a_row_cancelled_while_running_still_names_its_instance(tiny_pair_dir):
    async def scenario(cluster):
        cluster.join_scripted("s")
        reply = cluster.submit(routed([INFOBENCH], max_tokens=[8]))
        [row] = rows_sent(cluster, "s")
        reply.cancelled = True
        cluster.core.poll_cancellations()
        assert cluster.received["s"][-1] == Cancel((row.row,))
        stopped = RowOutcome(text="Lig", finish_reason="cancelled", num_output_tokens=2, instance="s")
        cluster.core.instance_done(cluster.channels["s"], row.row, stopped, IDLE_LOAD)
        [[outcome]] = reply.finals
        assert (outcome.finish_reason, outcome.error) == ("cancelled", "request cancelled")
        assert (outcome.instance, outcome.num_output_tokens) == ("s", 2)
        assert cluster.core.held == 0

    run_cluster(None, tiny_pair_dir, scenario)


def test_a_request_over_the_capacity_sized_queue_bound_is_refused_whole(tiny_pair_dir):
    slow_single_row = InstanceLoad(blocks_total=256, blocks_free=256, seconds_per_token=1.0, max_rows=1)
    # an SLA loose enough for a prompt to wait out the first one's 64 s: only the bound refuses
    admission = AdmissionConfig(queue_limit=256, queue_min=2, ttft_sla_s=1000.0, tpot_sla_s=10.0)

    async def scenario(cluster):
        cluster.join_scripted("s", slow_single_row)
        cluster.submit(routed([INFOBENCH], max_tokens=[64]))  # takes the instance's one row
        cluster.submit(routed([OTHER], max_tokens=[64]))  # waits
        assert len(rows_sent(cluster, "s")) == 1 and cluster.core.queued == 1
        assert cluster.core._policy.queue_bound() == 2, "a slow instance: the bound is queue_min"

        refused = cluster.reply()
        with pytest.raises(Overloaded, match=r"1 prompts are queued \(limit 2\)"):
            cluster.core.submit(routed([INFOBENCH, OTHER], max_tokens=[64]), refused)
        assert cluster.core.queued == 1, "nothing of a refused request stays queued"

    run_cluster(None, tiny_pair_dir, scenario, admission=admission)


def test_a_prompt_that_cannot_meet_its_deadline_is_counted_shed_before_its_answer(tiny_pair_dir):
    order: list[str] = []

    class ShedRecorder(Recorder):
        def shed(self, prompts) -> None:
            order.append(f"shed {prompts}")

    async def scenario(cluster):
        cluster.join_scripted("a")
        reply = cluster.reply()
        final = reply.final
        reply.final = lambda outcomes: (order.append("answer"), final(outcomes))
        # a few hundred predicted tokens cannot come within 20 ms
        cluster.submit(routed([INFOBENCH], max_tokens=[300], timeout_s=0.02), reply)
        [outcome] = await cluster.answer(reply)
        assert outcome.error == "deadline exceeded" and outcome.finish_reason == "cancelled"
        assert order == ["shed 1", "answer"]
        assert rows_sent(cluster, "a") == [], "the prompt never ran"
        assert cluster.core.held == 0

    run_cluster(None, tiny_pair_dir, scenario, events=ShedRecorder())


def test_the_scheduler_predicts_each_prompt_s_length_within_its_max_tokens(tiny_pair_dir):
    async def scenario(cluster):
        cluster.submit(routed([INFOBENCH, MMLU], max_tokens=[16]))
        cluster.submit(unplaced())
        generate, score, route = cluster.core._prompts.values()  # queued: no instance yet
        assert LengthPredictor().predict(INFOBENCH, "infobench") > 16
        assert generate.predicted_tokens == 16, "max_tokens caps the prediction"
        assert (score.predicted_tokens, route.predicted_tokens) == (1, 4), "one scored token; the draft row"
        assert all(r.ticket.predicted_tokens == r.predicted_tokens > 0 for r in (generate, score, route))
        assert all(r.ticket.prefix_keys == prefix_keys(r.model_text) for r in (generate, score, route))
        assert cluster.core.queued == 3 and cluster.core.running_rows == 0

    run_cluster(None, tiny_pair_dir, scenario)


def test_the_turns_of_a_conversation_start_where_the_first_turn_ran(tiny_pair_dir):
    system = "Instruction: You are a careful assistant who answers in one short sentence. " * 12

    async def scenario(cluster):
        cluster.join_scripted("a")
        cluster.join_scripted("b")
        cluster.submit(routed(["Instruction: Name a river.\nQuestion: \nGeneration:"], max_tokens=[8]))
        cluster.submit(routed([system + "\nQuestion: hi\nGeneration:"], max_tokens=[8]))
        assert [len(rows_sent(cluster, name)) for name in ("a", "b")] == [1, 1], "least loaded first"
        # one row each: by load alone "a" would come first; the prefix went to "b"
        cluster.submit(routed([system + "\nQuestion: and again?\nGeneration:"], max_tokens=[8]))
        assert [len(rows_sent(cluster, name)) for name in ("a", "b")] == [1, 2]
        assert rows_sent(cluster, "b")[1].prompt.endswith("and again?\nGeneration:")

    run_cluster(None, tiny_pair_dir, scenario)

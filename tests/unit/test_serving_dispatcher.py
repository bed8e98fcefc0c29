"""The dispatcher's wall-clock loop driving the real policy and the real engine."""

from __future__ import annotations

import asyncio

import pytest

from specbatch.decoding import Engine, GenerationRequest, load_model_pair
from specbatch.scheduling import PolicyConfig, SchedulingPolicy
from specbatch.serving.dispatcher import Dispatcher, PromptJob
from specbatch.serving.outcomes import PromptOutcome
from specbatch.serving.params import SamplingParams
from specbatch.serving.protocol import batch_result_from_arrays, worker_result_arrays
from specbatch.serving.tasks import SCORE, prepare_prompt
from specbatch.serving.worker import BatchWorker, WorkItem

MMLU = "Question:\nWhich organ produces insulin?\n\nChoices:\nA. Liver\nB. Pancreas\nC. Kidney"


class EngineBackend:
    """Runs batches on a real BatchWorker in a thread, as qwen3_specdec does behind BLS."""

    def __init__(self, worker: BatchWorker, fail_first_generate: bool = False) -> None:
        self.worker = worker
        self.batch_sizes: list[tuple[str, int]] = []
        self.early_rows: list[int] = []
        self._fail_next = fail_first_generate

    async def run(self, kind, jobs, on_deltas, on_row_done):
        self.batch_sizes.append((kind, len(jobs)))
        if kind != SCORE and self._fail_next:
            self._fail_next = False
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        items = [
            WorkItem(
                j.prepared.model_prompt,
                j.sampling.max_tokens,
                j.sampling.temperature,
                continuations=j.prepared.continuations,
            )
            for j in jobs
        ]
        mode = "score" if kind == SCORE else "speculative"
        loop = asyncio.get_running_loop()

        def deltas_on_loop(deltas):
            loop.call_soon_threadsafe(on_deltas, deltas)

        def row_done_on_loop(row, outcome, first_token_s):
            self.early_rows.append(row)
            loop.call_soon_threadsafe(on_row_done, row, outcome, first_token_s)

        result = await asyncio.to_thread(self.worker.run, mode, items, deltas_on_loop, row_done_on_loop)
        return batch_result_from_arrays(worker_result_arrays(result))


@pytest.fixture(scope="module")
def engine(tiny_pair_dir):
    pair = load_model_pair(str(tiny_pair_dir / "target"), str(tiny_pair_dir / "draft"), device="cpu")
    return Engine(pair, lookahead=2)


def make_jobs(prompts: list[str], tasks: list[str], sink: dict[int, PromptOutcome]) -> list[PromptJob]:
    jobs = []
    for index, (prompt, task) in enumerate(zip(prompts, tasks, strict=True)):
        jobs.append(
            PromptJob(
                key=(0, index),
                prepared=prepare_prompt(prompt, task),
                sampling=SamplingParams(max_tokens=6 + index % 3, temperature=0.0, top_p=1.0, top_k=0),
                input_tokens=20,
                predicted_tokens=6 + index % 3,
                arrival_s=0.0,
                on_done=lambda outcome, i=index: sink.__setitem__(i, outcome),
            )
        )
    return jobs


async def drive(dispatcher: Dispatcher, jobs: list[PromptJob], sink: dict) -> None:
    runner = asyncio.ensure_future(dispatcher.run())
    for job in jobs:
        dispatcher.submit(job)
    while len(sink) < len(jobs):
        await asyncio.sleep(0.01)
    dispatcher.stop()
    await runner


def policy() -> SchedulingPolicy:
    return SchedulingPolicy(
        PolicyConfig(num_bins=2, boundaries="fixed", max_len=16, flush_window_s=0.05, b_max=8),
        ["worker0", "worker1"],
    )


def test_batches_answer_every_prompt_exactly_as_the_engine_alone(engine):
    prompts = [f"Instruction: Describe item {i}.\nQuestion: \nGeneration:" for i in range(10)] + [MMLU, MMLU]
    tasks = ["infobench"] * 10 + ["mmlu"] * 2
    sink: dict[int, PromptOutcome] = {}
    jobs = make_jobs(prompts, tasks, sink)
    backend = EngineBackend(BatchWorker(engine))
    asyncio.run(drive(Dispatcher(policy(), backend, ["worker0", "worker1"]), jobs, sink))

    reference = engine.generate(
        [GenerationRequest(j.prepared.model_prompt, max_new_tokens=j.sampling.max_tokens) for j in jobs[:10]],
        mode="target_only",
    )
    assert [sink[i].text for i in range(10)] == [r.text for r in reference]
    assert all(sink[i].task == "infobench" and sink[i].total_draft_tokens > 0 for i in range(10))
    assert sink[10].text == sink[11].text and sink[10].text.startswith("The answer is (")
    generate_batches = [size for kind, size in backend.batch_sizes if kind != SCORE]
    assert sum(generate_batches) == 10 and len(generate_batches) < 10
    assert backend.batch_sizes[0] == (SCORE, 2), "scoring jobs go out first"
    assert len(backend.early_rows) == 10, "every generated row is answered as soon as it finishes"


def test_a_failing_batch_fails_its_own_prompts_only(engine):
    prompts = [f"Instruction: Give fact {i}.\nQuestion: \nGeneration:" for i in range(6)]
    sink: dict[int, PromptOutcome] = {}
    jobs = make_jobs(prompts, ["infobench"] * 6, sink)
    backend = EngineBackend(BatchWorker(engine), fail_first_generate=True)
    dispatcher = Dispatcher(policy(), backend, ["worker0", "worker1"])

    async def staged():
        runner = asyncio.ensure_future(dispatcher.run())
        for job in jobs[:3]:
            dispatcher.submit(job)
        while len(sink) < 3:
            await asyncio.sleep(0.01)
        for job in jobs[3:]:
            dispatcher.submit(job)
        while len(sink) < 6:
            await asyncio.sleep(0.01)
        dispatcher.stop()
        await runner

    asyncio.run(staged())
    failed = [i for i in range(6) if sink[i].finish_reason == "error"]
    assert failed and all("illegal memory access" in sink[i].error for i in failed)
    assert all(sink[i].text and not sink[i].error for i in range(3, 6))
    assert dispatcher.stats.failed_batches == 1


def test_dispatcher_needs_a_worker():
    with pytest.raises(ValueError, match="worker"):
        Dispatcher(policy(), EngineBackend(None), [])

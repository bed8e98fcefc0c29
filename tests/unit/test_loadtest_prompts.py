"""Prompt pools: every task the mix sends has prompts, draws follow the mix and the token caps."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from specbatch.loadtest.profiles import ProfileError, PromptSource, Workload, load_profile
from specbatch.loadtest.prompts import PromptPool, build_prompt_pool
from specbatch.routing.workload import generate_workload

SMOKE = Path(__file__).resolve().parents[2] / "loadtest" / "profiles" / "smoke.yaml"


def smoke_workload(**changes: object) -> Workload:
    return replace(load_profile(SMOKE).workload, **changes)


def test_generated_pool_holds_count_prompts_of_each_task_in_the_mix():
    workload = smoke_workload(mix={"graph": 1.0, "infobench": 2.0})

    pool = build_prompt_pool(workload)

    count = workload.prompts.count
    assert pool.tasks == ["graph", "infobench"]
    assert pool.prompts_by_task["graph"] == [p.text for p in generate_workload(count, 7, {"graph": 1.0})]
    assert len(pool.prompts_by_task["infobench"]) == count


def test_draws_follow_the_mix_and_never_send_a_zero_weight_task():
    pool = PromptPool(
        {"graph": ["g"], "mmlu": ["m"], "infobench": ["i"]}, {"graph": 1, "mmlu": 0, "infobench": 3}
    )
    rng = random.Random(0)

    counts = Counter(pool.draw(rng).task for _ in range(4000))

    assert counts["mmlu"] == 0
    assert counts["infobench"] / counts["graph"] == pytest.approx(3.0, rel=0.1)


def test_max_tokens_are_drawn_inside_the_range_and_absent_tasks_get_none():
    pool = PromptPool(
        {"graph": ["g"], "infobench": ["i"]}, {"graph": 1, "infobench": 1}, {"infobench": (16, 20)}
    )
    rng = random.Random(1)

    draws = [pool.draw(rng) for _ in range(400)]

    assert {d.max_tokens for d in draws if d.task == "infobench"} == {16, 17, 18, 19, 20}
    assert {d.max_tokens for d in draws if d.task == "graph"} == {None}


def test_draws_are_reproducible_by_seed():
    pool = build_prompt_pool(smoke_workload())

    first = [pool.draw(random.Random("7:0")) for _ in range(3)]
    again = [pool.draw(random.Random("7:0")) for _ in range(3)]

    assert first == again


def test_file_source_groups_prompts_by_task(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text(
        '{"text": "Instruction: Say hi.", "task": "infobench"}\n\n'
        '{"text": "Question:\\nWhich?\\n\\nChoices:\\nA. x\\nB. y", "task": "mmlu"}\n'
        '{"text": "Summarize this.", "task": "infobench"}\n'
    )
    workload = smoke_workload(
        prompts=PromptSource(kind="file", path=path), mix={"mmlu": 1.0, "infobench": 1.0}
    )

    pool = build_prompt_pool(workload)

    assert pool.prompts_by_task == {
        "infobench": ["Instruction: Say hi.", "Summarize this."],
        "mmlu": ["Question:\nWhich?\n\nChoices:\nA. x\nB. y"],
    }


def test_file_without_a_task_the_mix_sends_is_refused(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"text": "Instruction: Say hi.", "task": "infobench"}\n')

    with pytest.raises(ProfileError, match="no prompts for graph, mmlu, which the mix sends"):
        build_prompt_pool(smoke_workload(prompts=PromptSource(kind="file", path=path)))


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", r"prompts\.jsonl:1: not a JSON object"),
        ('{"task": "mmlu"}', r'prompts\.jsonl:1: expected \{"text"'),
        ('{"text": "hi", "task": "chat"}', r"prompts\.jsonl:1: task must be one of graph, mmlu, infobench"),
    ],
)
def test_bad_prompt_file_lines_are_named(tmp_path, line, message):
    path = tmp_path / "prompts.jsonl"
    path.write_text(line + "\n")

    with pytest.raises(ProfileError, match=message):
        build_prompt_pool(smoke_workload(prompts=PromptSource(kind="file", path=path)))

"""Routing by structure: both renderings of every task, perturbations, ambiguity and the fallback."""

from __future__ import annotations

import pytest

from specbatch.routing import (
    RoutingError,
    build_fallback_prompt,
    classify,
    generate_workload,
    intent,
    route_evidence,
)

GRAPH = (
    "You are given a directed graph with 4 nodes (numbered 0 to 3) and the following edges:\n\n"
    "Edges (source -> target, weight):\n0 -> 1, weight: 3\n1 -> 3, weight: 4\n0 -> 2, weight: 9\n"
    "2 -> 3, weight: 1\n\nFind the top 2 shortest paths from node 0 to node 3.\n\n"
    "Return your answer by calling the submit_paths function with:\n"
    "- paths: A list of paths, where each path is a list of node indices\n"
    "- weights: A list of corresponding path weights\n\n"
    "For example, if the shortest path is [0, 2, 4] with weight 10, call:\n"
    "submit_paths(paths=[[0, 2, 4]], weights=[10])\n"
)
MMLU_REQUEST = (
    "The following is a multiple choice question (with answers) about clinical knowledge.  Output the answer "
    'in the format of "The answer is (X)" at the end.\n\nQuestion: Which of the following is the most common '
    "cause of community-acquired pneumonia?\n Options:\nA. Staphylococcus aureus\nB. Streptococcus "
    "pneumoniae\nC. Klebsiella pneumoniae\nD. Legionella pneumophila\nAnswer:"
)
MMLU_DATASET = (
    "Question:\nA 62-year-old woman has had fatigue for three months. Her haemoglobin is 9.1 g/dL with a "
    "low MCV. Which test should be ordered next?\n\nChoices:\nA. Serum ferritin\nB. Bone marrow biopsy\n"
    "C. Vitamin B12 level\nD. Haptoglobin\nE. Reticulocyte count"
)
INFOBENCH_REQUEST = "Instruction: Write a short poem about the ocean at night.\nQuestion: \nGeneration:"
INFOBENCH_REQUEST_WITH_INPUT = (
    "Instruction: Summarize the paragraph in one sentence.\nQuestion: Photosynthesis converts light energy "
    "into chemical energy stored in glucose, releasing oxygen as a by-product.\nGeneration:"
)
INFOBENCH_DATASET = "Give me a list of five healthy snacks I can take to work."
INFOBENCH_DATASET_WITH_INPUT = (
    "Rewrite the sentence below in the passive voice.\n\nThe committee approved the new budget on Monday."
)

RENDERINGS = [
    (GRAPH, "graph"),
    (MMLU_REQUEST, "mmlu"),
    (MMLU_DATASET, "mmlu"),
    (INFOBENCH_REQUEST, "infobench"),
    (INFOBENCH_REQUEST_WITH_INPUT, "infobench"),
    (INFOBENCH_DATASET, "infobench"),
    (INFOBENCH_DATASET_WITH_INPUT, "infobench"),
]

PERTURBATIONS = {
    "identity": lambda text: text,
    "upper": str.upper,
    "lower": str.lower,
    "crlf": lambda text: text.replace("\n", "\r\n"),
    "preamble": lambda text: "You are a careful assistant. Do your best.\n\n" + text,
    "no_blank_lines": lambda text: text.replace("\n\n", "\n"),
    "indent_and_trailing_space": lambda text: "\n".join("  " + line + " \t" for line in text.split("\n")),
    "paren_labels": lambda text: (
        text.replace("\nA. ", "\n(A) ")
        .replace("\nB. ", "\n(B) ")
        .replace("\nC. ", "\n(C) ")
        .replace("\nD. ", "\n(D) ")
        .replace("\nE. ", "\n(E) ")
    ),
}


@pytest.mark.parametrize(("prompt", "task"), RENDERINGS)
@pytest.mark.parametrize("perturbation", sorted(PERTURBATIONS))
def test_both_renderings_route_under_perturbations(prompt: str, task: str, perturbation: str):
    assert classify(PERTURBATIONS[perturbation](prompt)) == task


def test_dataset_renderings_carry_none_of_the_request_keywords():
    for prompt in (MMLU_DATASET, INFOBENCH_DATASET, INFOBENCH_DATASET_WITH_INPUT):
        assert "multiple choice" not in prompt.lower()
        assert "instruction:" not in prompt.lower()


def test_ten_option_question_without_preamble_is_mmlu():
    options = "\n".join(f"{letter}. option {i}" for i, letter in enumerate("ABCDEFGHIJ"))
    assert classify(f"Question: Which of these is correct?\nOptions:\n{options}\nAnswer:") == "mmlu"


def test_mmlu_answer_cue_may_follow_a_directive():
    prompt = MMLU_DATASET + "\n\nAnswer with the letter of the correct option only.\nAnswer:"
    assert classify(prompt) == "mmlu"


@pytest.mark.parametrize(
    "prompt",
    [
        "Create three multiple choice questions about volcanoes with four options each.",
        "Explain how Dijkstra's algorithm finds the shortest path from node 0 to node 5 in a weighted graph.",
        "Convert this edge list into an adjacency matrix.\n\n0 -> 1, weight: 4\n1 -> 2, weight: 7",
        "Answer the customer politely.\n\nQuestion: When does the store open on Sundays?",
        "Instruction: Answer the quiz question and explain.\nQuestion: Which gas do plants absorb?\n"
        "A. Oxygen\nB. Carbon dioxide\nC. Nitrogen\nGeneration:",
        "Rank these languages from easiest to hardest for a beginner and justify the order.\n\n"
        "A. Python\nB. C++\nC. Rust",
        "Find the cheapest route from node 0 to node 2 and explain it.\n\n"
        "0 -> 1, weight: 1\n1 -> 2, weight: 1",
    ],
)
def test_lookalike_open_instructions_are_infobench(prompt: str):
    assert classify(prompt, fallback=lambda _: "mmlu") == "infobench"


# Lettered options with nothing that asks to choose among them or to do anything else.
AMBIGUOUS = "Here are my dinner options for tonight:\n\nA. Pizza\nB. Sushi\nC. Tacos"


def test_unmarked_option_list_is_ambiguous():
    assert route_evidence(AMBIGUOUS).decision is None


def test_ambiguous_without_fallback_is_infobench():
    assert classify(AMBIGUOUS) == "infobench"


def test_fallback_decides_only_the_ambiguous():
    asked: list[str] = []

    def fallback(prompt: str) -> str:
        asked.append(prompt)
        return " MMLU\n"

    assert classify(AMBIGUOUS, fallback=fallback) == "mmlu"
    assert classify(MMLU_DATASET, fallback=fallback) == "mmlu"
    assert classify(INFOBENCH_DATASET, fallback=fallback) == "infobench"
    assert asked == [AMBIGUOUS]


@pytest.mark.parametrize("answer", ["I think it is a quiz", None, "", "graph paper"])
def test_fallback_answers_that_are_not_tasks_are_ignored(answer):
    assert classify(AMBIGUOUS, fallback=lambda _: answer) == "infobench"


def test_failing_fallback_routes_to_infobench():
    def broken(_: str) -> str:
        raise RuntimeError("draft model unavailable")

    assert classify(AMBIGUOUS, fallback=broken) == "infobench"


def test_readable_graph_without_a_shortest_path_request_is_infobench():
    prompt = "What is the best way to get from node 0 to node 2?\n\n0 -> 1, weight: 1\n1 -> 2, weight: 1"
    assert route_evidence(prompt).decision == "infobench"
    assert classify(prompt + "\nFind the shortest path.") == "graph"


def test_fallback_may_only_pick_a_task_whose_handler_reads_the_prompt():
    assert route_evidence(AMBIGUOUS).candidates == ("mmlu", "infobench")
    assert classify(AMBIGUOUS, fallback=lambda _: "graph") == "infobench"


def test_generated_mixed_workload_accuracy_is_at_least_99_5_percent():
    workload = generate_workload(3000, seed=11)
    correct = sum(classify(prompt.text) == prompt.task for prompt in workload)
    assert correct / len(workload) >= 0.995


def test_dataset_mmlu_prompts_have_no_keyword_yet_route_to_mmlu():
    workload = [p for p in generate_workload(600, seed=5) if p.rendering == "dataset" and p.task == "mmlu"]
    assert workload
    assert not any("multiple choice" in p.text.lower() for p in workload)
    assert all(classify(p.text) == "mmlu" for p in workload)


@pytest.mark.parametrize("prompt", [None, b"bytes prompt", 42])
def test_non_text_prompts_raise_a_routing_error(prompt):
    with pytest.raises(RoutingError, match="must be a string"):
        classify(prompt)


def test_fallback_prompt_names_the_tasks_and_keeps_head_and_tail_of_long_prompts():
    short = build_fallback_prompt(AMBIGUOUS)
    assert AMBIGUOUS in short
    assert all(task in short for task in ("graph", "mmlu", "infobench"))
    long_prompt = "HEAD " + "x" * 5000 + " TAIL"
    cut = build_fallback_prompt(long_prompt, max_chars=200)
    assert "HEAD" in cut and "TAIL" in cut and len(cut) < 600


@pytest.mark.parametrize(
    ("stem", "instructions"),
    [
        ("A trial is designed to evaluate a new drug. Which feature best reduces confounding?", ""),
        ("A man is short of breath with exertion and when lying down. What is the diagnosis?", ""),
        ('She asks, "Why me?" Which response is most appropriate?', ""),
        ("Review of systems is positive for cold intolerance. Which finding is most likely?", ""),
        ("Explain your answer. Which vitamin is made in the skin?", "explain your answer."),
        ("Can you rephrase this question? Which organ makes insulin?", "can you rephrase this question?"),
        (
            "For the question below, describe each option. Which nerve is injured?",
            "for the question below, describe each option.",
        ),
    ],
)
def test_only_the_sentences_of_a_stem_that_speak_to_the_reader_are_instructions(stem: str, instructions: str):
    assert intent.instructions_in(stem) == instructions


@pytest.mark.parametrize(
    ("text", "appended"),
    [
        ("Which feature best reduces confounding, and why?", True),
        ("Which drug is first line — and why?", True),
        ("Which is correct, and what is wrong with the others?", True),
        ("A cardiologist asks when and why the pain occurs. Which best describes it?", False),
        ("Which patient is short of breath with exertion and when lying down?", False),
    ],
)
def test_a_second_open_question_appended_to_the_stem_is_found(text: str, appended: bool):
    assert (intent.appended_question(text) is not None) == appended


def test_a_graph_that_ends_in_options_to_choose_from_is_ambiguous():
    prompt = (
        GRAPH.split("Return your answer")[0]
        + "Which of the following lists the 2 shortest paths?\n\n"
        "Options:\nA. 0-1-3 and 0-2-3\nB. 0-2-3 only\nAnswer:"
    )
    evidence = route_evidence(prompt)
    assert evidence.decision is None
    assert evidence.candidates == ("mmlu", "infobench")


@pytest.mark.parametrize(
    "stem",
    [
        "A biopsy of an enlarged cervical lymph node shows Reed-Sternberg cells. Which pathway is activated?",
        "A 30-year-old man has a fracture of the second cervical vertebra. Which artery is at risk en route?",
        "Which enzyme converts angiotensin I in the renin-angiotensin pathway of this patient with a "
        "sympathetic surge?",
    ],
)
def test_clinical_stems_naming_paths_nodes_and_vertebrae_are_mmlu(stem: str):
    options = "A. The first\nB. The second\nC. The third\nD. The fourth"
    assert classify(f"Question: {stem}\n Options:\n{options}\nAnswer:") == "mmlu"
    assert classify(f"{stem}\n\nChoices:\n{options}") == "mmlu"


@pytest.mark.parametrize(
    "sentence",
    [
        "Should I pick the second one?",
        "Which would you choose?",
        "Do you think the first is right?",
        "What is your opinion?",
        "Help me decide between them.",
        "My friend and I disagree; who is right?",
        "I think it is the first one.",
        "My teacher says the answer is C.",
    ],
)
def test_a_wish_for_an_opinion_inside_the_stem_is_not_a_letter_question(sentence: str):
    prompt = f"Question: Which gas do plants absorb? {sentence}\nA. Oxygen\nB. Carbon dioxide\nC. Nitrogen"
    assert classify(prompt) == "infobench"

"""Routing benchmark: accuracy and time per prompt on the generated workload and a labelled corpus.

Measures, on one seeded workload, the structural classifier next to a keyword router
(one fixed phrase per task, which paraphrases break), the graph solver and the mmlu
parser against the workload's expected answers, the length predictor, and Yen on a dense 20-node graph.
On the hand-written routing precision corpus (paraphrases and look-alikes, see
tests/unit/data/routing_precision.txt) it reports precision and recall of the graph and
mmlu routes, how many routed prompts the handler then reads right, how many negatives
reached a canned handler, and the classification time per prompt. Prints markdown
tables; ``--out FILE`` also writes the figures as JSON.

    python scripts/bench_routing.py --n 10000 --seed 0 --out bench_routing.json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import random
import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from specbatch.routing import (
    LengthPredictor,
    WorkloadPrompt,
    classify,
    generate_workload,
    parse_mmlu,
    route_evidence,
    solve_graph,
)
from specbatch.routing.labelled import handler_reads_it, load_corpus, score

logger = logging.getLogger("bench_routing")
DEFAULT_CORPUS = Path(__file__).resolve().parents[1] / "tests" / "unit" / "data" / "routing_precision.txt"


def keyword_router(prompt: str) -> str:
    """A router that looks for one fixed phrase per task: the baseline that paraphrases break."""
    lower = prompt.lower()
    if "submit_paths" in lower:
        return "graph"
    if "multiple choice" in lower:
        return "mmlu"
    return "infobench"


def timed(function: Callable[[Any], Any], items: Sequence[Any]) -> tuple[list[Any], list[float]]:
    """Results and per-call times in microseconds (after one warm-up pass over 100 items)."""
    for item in items[:100]:
        function(item)
    results, micros = [], []
    for item in items:
        start = time.perf_counter_ns()
        results.append(function(item))
        micros.append((time.perf_counter_ns() - start) / 1000)
    return results, micros


def summary(name: str, correct: int, total: int, micros: list[float]) -> dict[str, Any]:
    ordered = sorted(micros)
    return {
        "stage": name,
        "prompts": total,
        "accuracy": correct / total if total else None,
        "median_us": statistics.median(ordered),
        "p99_us": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
    }


def dense_graph_prompt(seed: int, nodes: int = 20, paths: int = 5) -> str:
    rng = random.Random(seed)
    edges = "\n".join(
        f"{u} -> {v}, weight: {rng.randint(1, 100)}" for u in range(nodes) for v in range(nodes) if u != v
    )
    return (
        f"You are given a directed graph with {nodes} nodes (numbered 0 to {nodes - 1}) and the following "
        f"edges:\n\nEdges (source -> target, weight):\n{edges}\n\nFind the top {paths} shortest paths from "
        f"node 0 to node {nodes - 1}.\n\nReturn your answer by calling the submit_paths function."
    )


def safe(function: Callable[[str], Any]) -> Callable[[str], Any]:
    def wrapped(text: str) -> Any:
        try:
            return function(text)
        except ValueError as error:
            return error

    return wrapped


def corpus_figures(path: Path) -> dict[str, Any]:
    """Precision and recall of the canned routes on a labelled corpus, and time per decision."""
    corpus = load_corpus(path)
    routed, micros = timed(classify, [case.prompt for case in corpus.cases])
    tasks = []
    for task_score in score(corpus.cases, routed):
        right = sum(
            route == case.task == task_score.task and handler_reads_it(corpus, case)
            for case, route in zip(corpus.cases, routed, strict=True)
        )
        tasks.append({
            "task": task_score.task,
            "labelled": task_score.labelled,
            "routed": task_score.routed,
            "correct": task_score.correct,
            "precision": task_score.precision,
            "recall": task_score.recall,
            "handler_right": right,
        })
    pairs = zip(corpus.cases, routed, strict=True)
    negatives = [(case, route) for case, route in pairs if case.task in ("infobench", "ambiguous")]
    ordered = sorted(micros)
    return {
        "path": str(path),
        "prompts": len(corpus.cases),
        "labels": dict(Counter(case.task for case in corpus.cases)),
        "tasks": tasks,
        "negatives": len(negatives),
        "negatives_canned": sorted(case.id for case, route in negatives if route in ("graph", "mmlu")),
        "ambiguous_by_structure": sum(route_evidence(c.prompt).decision is None for c in corpus.cases),
        "median_us": statistics.median(ordered),
        "p99_us": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
        "max_us": ordered[-1],
    }


def run(n: int, seed: int, corpus: Path = DEFAULT_CORPUS) -> dict[str, Any]:
    logger.info("generating %d prompts (seed %d)", n, seed)
    workload: list[WorkloadPrompt] = generate_workload(n, seed)
    texts = [prompt.text for prompt in workload]

    logger.info("classifying")
    predicted, classify_us = timed(classify, texts)
    keyword_predicted, keyword_us = timed(keyword_router, texts)
    ambiguous = sum(route_evidence(text).decision is None for text in texts)
    by_rendering: Counter[tuple[str, str]] = Counter()
    wrong_by_rendering: Counter[tuple[str, str]] = Counter()
    keyword_wrong_by_rendering: Counter[tuple[str, str]] = Counter()
    for prompt, task, keyword_task in zip(workload, predicted, keyword_predicted, strict=True):
        key = (prompt.task, prompt.rendering)
        by_rendering[key] += 1
        wrong_by_rendering[key] += task != prompt.task
        keyword_wrong_by_rendering[key] += keyword_task != prompt.task

    logger.info("solving graph prompts and parsing mmlu prompts")
    graphs = [prompt for prompt in workload if prompt.task == "graph"]
    answers, graph_us = timed(safe(solve_graph), [prompt.text for prompt in graphs])
    questions = [prompt for prompt in workload if prompt.task == "mmlu"]
    parsed, mmlu_us = timed(safe(parse_mmlu), [prompt.text for prompt in questions])

    logger.info("predicting lengths")
    predictor = LengthPredictor()
    _, length_us = timed(lambda item: predictor.predict(*item), [(p.text, p.task) for p in workload])

    logger.info("solving dense 20-node graphs, P = 5")
    dense = [dense_graph_prompt(s) for s in range(50)]
    _, dense_us = timed(solve_graph, dense * 3)

    rows = [
        summary("classify (structural)", sum(p == w.task for p, w in zip(predicted, workload, strict=True)),
                n, classify_us),
        summary("classify (keyword baseline)",
                sum(p == w.task for p, w in zip(keyword_predicted, workload, strict=True)), n, keyword_us),
        summary("solve_graph (exact answer)",
                sum(a == g.expected for a, g in zip(answers, graphs, strict=True)), len(graphs), graph_us),
        summary("parse_mmlu (labels)",
                sum(not isinstance(q, ValueError) and q.labels == p.expected
                    for q, p in zip(parsed, questions, strict=True)),
                len(questions), mmlu_us),
        summary("LengthPredictor.predict", n, n, length_us),
        summary("solve_graph, dense 20 nodes, P = 5", len(dense) * 3, len(dense) * 3, dense_us),
    ]
    rows[-2]["accuracy"] = None
    rows[-1]["accuracy"] = None
    per_rendering = [
        {
            "task": task,
            "rendering": rendering,
            "prompts": count,
            "structural_accuracy": 1 - wrong_by_rendering[(task, rendering)] / count,
            "keyword_accuracy": 1 - keyword_wrong_by_rendering[(task, rendering)] / count,
        }
        for (task, rendering), count in sorted(by_rendering.items())
    ]
    logger.info("scoring the labelled corpus %s", corpus)
    return {
        "n": n,
        "seed": seed,
        "corpus": corpus_figures(corpus),
        "ambiguous_prompts": ambiguous,
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
        },
        "rows": rows,
        "per_rendering": per_rendering,
    }


def markdown(result: dict[str, Any]) -> str:
    def percent(value: float | None) -> str:
        return "—" if value is None else f"{100 * value:.2f} %"

    lines = [
        "| stage | prompts | accuracy | median µs | p99 µs |",
        "|---|---:|---:|---:|---:|",
    ]
    for row in result["rows"]:
        lines.append(
            f"| {row['stage']} | {row['prompts']} | {percent(row['accuracy'])} | "
            f"{row['median_us']:.1f} | {row['p99_us']:.1f} |"
        )
    lines += [
        "",
        "| task | rendering | prompts | structural | keyword baseline |",
        "|---|---|---:|---:|---:|",
    ]
    for row in result["per_rendering"]:
        lines.append(
            f"| {row['task']} | {row['rendering']} | {row['prompts']} | "
            f"{percent(row['structural_accuracy'])} | {percent(row['keyword_accuracy'])} |"
        )
    lines.append("")
    lines.append(
        f"{result['ambiguous_prompts']} of {result['n']} prompts were ambiguous by structure "
        "(sent to the fallback in service; counted here as routed without one, to infobench)."
    )
    corpus = result["corpus"]
    lines += [
        "",
        f"Labelled corpus ({corpus['prompts']} prompts: "
        + ", ".join(f"{count} {label}" for label, count in sorted(corpus["labels"].items())) + "):",
        "",
        "| route | labelled | routed | correct | precision | recall | handler reads it right |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in corpus["tasks"]:
        lines.append(
            f"| {row['task']} | {row['labelled']} | {row['routed']} | {row['correct']} | "
            f"{percent(row['precision'])} | {percent(row['recall'])} | "
            f"{row['handler_right']} of {row['labelled']} |"
        )
    canned = corpus["negatives_canned"]
    lines += [
        "",
        f"Negatives (infobench and ambiguous) sent to graph or mmlu: {len(canned)} of {corpus['negatives']}"
        + (f" ({', '.join(canned)})" if canned else "") + "; "
        f"{corpus['ambiguous_by_structure']} prompts left to the fallback.",
        f"Classification time on the corpus: median {corpus['median_us']:.1f} µs, "
        f"p99 {corpus['p99_us']:.1f} µs, max {corpus['max_us']:.1f} µs.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=10000, help="prompts in the generated workload")
    parser.add_argument("--seed", type=int, default=0, help="workload seed")
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS, help="labelled routing corpus")
    parser.add_argument("--out", help="also write the figures to this JSON file")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    result = run(args.n, args.seed, args.corpus)
    print(markdown(result))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=2)
        logger.info("wrote %s", args.out)


if __name__ == "__main__":
    main()

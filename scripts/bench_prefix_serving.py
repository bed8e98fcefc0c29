"""Prefix reuse through the real server and its OpenAI front, on two instances.

Four set-ups serve the same requests, one after another in each of ``--rounds``
interleaved rounds, each on a server of its own (cpu config, embedded tiny pair):

- ``reuse off``: SPECBATCH_PREFIX_CACHING=off;
- ``least loaded``: reuse on, the scheduler placing by load alone (prefix_affinity_rows -1);
- ``prefix aware``: reuse on, a prompt going where its prefix went when that instance
  runs at most 2 rows more than the least loaded (the default, prefix_affinity_rows 2);
- ``holder until full``: the same with no bound on the difference (prefix_affinity_rows
  64): the holder gets the prompt whenever its own caps (b_mem, b_SLA) leave it a row.

Two workloads, streamed through /v1/chat/completions with the openai client, greedy,
closed loop (``--concurrency`` conversations at a time):

- ``tenant_system_prompts``: one-turn requests of ``--tenants`` applications, each with
  its own system prompt of 1-2k tokens, and a short user turn. Together the system
  prompts outgrow one instance's KV pool but not two: where they are placed decides
  whether they stay cached.
- ``multi_turn_chat``: conversations of 4-8 turns after a system prompt of their own;
  each turn is sent a pause (``--think-s`` on average) after the previous answer is in,
  the history growing by each user turn and answer. Without the pause a closed loop
  sends a turn back to the instance its last answer just left, the least loaded one, and
  placement by load alone looks prefix-aware by accident.

Per set-up and workload: first-token p50/p95 (for chat also per turn), output tokens/s,
goodput (requests within the cpu config's TTFT and TPOT targets, per second), and the
share of prompt tokens the instances found cached (their prefix hit and miss counters),
and the overload refusals (503) the clients retried: a refused request is sent again
after the reply's Retry-After (else half a second), its first token timed from the
first try.

    python scripts/bench_prefix_serving.py --quick --out results/bench_prefix_serving.json

Prints markdown tables, writes the JSON rows and a PNG (``--plot``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import random
import statistics
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import openai  # noqa: E402
from aiperf_bench import local_pipeline  # noqa: E402
from bench_production_shapes import config_parameter  # noqa: E402
from openai import AsyncOpenAI  # noqa: E402
from soak import metric_sum  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from specbatch.decoding.prefix_cache import reachable_hits  # noqa: E402
from specbatch.decoding.tokenizer_build import corpus  # noqa: E402
from specbatch.figures import save_figure  # noqa: E402
from specbatch.serving.chat import ChatFormat  # noqa: E402
from specbatch.serving.scheduler.tasks import prepare_prompt  # noqa: E402
from specbatch.serving.target_text import TargetText  # noqa: E402

logger = logging.getLogger("bench_prefix_serving")

# An overloaded server's 503 is retried after REFUSAL_RETRY_S (or its Retry-After), at most
# MAX_REFUSALS times for one request.
REFUSAL_RETRY_S = 0.5
MAX_REFUSALS = 120

SETUPS = {
    "reuse off": {"SPECBATCH_PREFIX_CACHING": "off"},
    "least loaded": {"SPECBATCH_PREFIX_AFFINITY_ROWS": "-1"},
    "prefix aware": {},
    "holder until full": {"SPECBATCH_PREFIX_AFFINITY_ROWS": "64"},
}
WORKLOADS = ("tenant_system_prompts", "multi_turn_chat")
PREFIX_COUNTERS = ("specbatch_prefix_hit_tokens_total", "specbatch_prefix_miss_tokens_total")
KV_BLOCK_SIZE = int(
    config_parameter(ROOT / "model_repository/qwen3_specdec/configs/cpu.pbtxt", "kv_block_size")
)


@dataclass(frozen=True)
class Conversation:
    """A system prompt and the user turns sent one after another, each with the answers so
    far; before each turn but the first the user thinks for its ``pauses`` seconds."""

    system: str
    user_turns: tuple[str, ...]
    max_tokens: int
    pauses: tuple[float, ...] = ()


class Text:
    """Plain sentences from the project's corpus words, sized in the tiny tokenizer's tokens."""

    def __init__(self, tokenizer_path: Path, seed: int) -> None:
        self.tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_path))
        self.words = [w for w in " ".join(corpus(lines=3000, seed=seed)).split() if w.isalpha()]
        self.rng = random.Random(seed)

    def sentences(self, tokens: int) -> str:
        parts: list[str] = []
        while len(self.tokenizer.encode(" ".join(parts), add_special_tokens=False)) < tokens:
            sentence = " ".join(self.rng.choices(self.words, k=self.rng.randint(6, 14)))
            parts.append(sentence.capitalize() + ".")
        return " ".join(parts)


def tenant_workload(text: Text, requests: int, tenants: int, max_tokens: int) -> list[Conversation]:
    systems = [
        f"You are assistant {i} of a help desk. " + text.sentences(text.rng.randint(1024, 2048))
        for i in range(tenants)
    ]
    return [
        Conversation(text.rng.choice(systems), (text.sentences(text.rng.randint(8, 40)) + "?",), max_tokens)
        for _ in range(requests)
    ]


def chat_workload(text: Text, conversations: int, max_tokens: int, think_s: float) -> list[Conversation]:
    """Conversations of 4-8 turns; users think ``think_s`` seconds on average (exponential)
    between an answer and their next turn, while other conversations go on."""
    chats = []
    for _ in range(conversations):
        turns = tuple(text.sentences(text.rng.randint(24, 96)) + "?" for _ in range(text.rng.randint(4, 8)))
        pauses = tuple(text.rng.expovariate(1 / think_s) if think_s > 0 else 0.0 for _ in turns[1:])
        system = "You are a patient tutor. " + text.sentences(text.rng.randint(256, 512))
        chats.append(Conversation(system, turns, max_tokens, pauses))
    return chats


async def create_retrying(client: AsyncOpenAI, **request) -> tuple[object, int]:
    """The streamed completion, sent again after each overload refusal (503) as a client
    told to retry later would: after the reply's Retry-After, else half a second. The
    caller's clock runs from the first try, so a refusal costs the request its wait.
    (stream, refusals before it was taken)."""
    refusals = 0
    while True:
        try:
            return await client.chat.completions.create(**request), refusals
        except openai.APIStatusError as error:
            if error.status_code != 503 or refusals >= MAX_REFUSALS:
                raise
            refusals += 1
            await asyncio.sleep(float(error.response.headers.get("retry-after", REFUSAL_RETRY_S)))


async def converse(client: AsyncOpenAI, index: int, conversation: Conversation) -> list[dict]:
    """Every turn of one conversation, streamed: one record per turn."""
    history: list[dict] = [{"role": "system", "content": conversation.system}]
    records = []
    for turn, user in enumerate(conversation.user_turns, start=1):
        if turn > 1:
            await asyncio.sleep(conversation.pauses[turn - 2])
        history.append({"role": "user", "content": user})
        sent = list(history)
        started = time.perf_counter()
        first, answer, usage = None, [], None
        stream, refusals = await create_retrying(
            client,
            model="specbatch",
            messages=history,
            max_tokens=conversation.max_tokens,
            temperature=0.0,
            stream=True,
            stream_options={"include_usage": True},
        )
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                first = first or time.perf_counter()
                answer.append(chunk.choices[0].delta.content)
            usage = chunk.usage or usage
        ended = time.perf_counter()
        history.append({"role": "assistant", "content": "".join(answer)})
        records.append(
            {
                "conversation": index,
                "turn": turn,
                "sent_s": started,
                "messages": sent,
                "ttft_s": (first or ended) - started,
                "e2e_s": ended - started,
                "prompt_tokens": usage.prompt_tokens,
                "completion_tokens": usage.completion_tokens,
                "refusals": refusals,
                "answer": history[-1]["content"],
            }
        )
    return records


async def closed_loop(
    url: str, conversations: list[Conversation], concurrency: int
) -> tuple[list[dict], float]:
    """All conversations, ``concurrency`` at a time in list order: (turn records, seconds)."""
    client = AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", timeout=600, max_retries=0)
    pending = list(enumerate(conversations))
    records: list[dict] = []

    async def worker() -> None:
        while pending:
            index, conversation = pending.pop(0)
            records.extend(await converse(client, index, conversation))

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    await client.close()
    return records, elapsed


def counters(metrics_url: str) -> tuple[float, float]:
    """(hit, miss) prompt tokens both instances have counted so far."""
    with urllib.request.urlopen(metrics_url, timeout=10) as reply:
        text = reply.read().decode()
    hit, miss = (metric_sum(text, name) for name in PREFIX_COUNTERS)
    return hit, miss


def settled_counters(
    metrics_url: str, before: tuple[float, float], prompt_tokens: int
) -> tuple[float, float]:
    """The counters once they count every prompt token sent since ``before`` (instances
    publish them a few times a second); after 10 s, whatever they say."""
    deadline = time.monotonic() + 10
    while True:
        hit, miss = counters(metrics_url)
        if hit + miss - sum(before) >= prompt_tokens or time.monotonic() > deadline:
            return hit - before[0], miss - before[1]
        time.sleep(0.2)


class ServedTokens:
    """The tokens the server runs for a chat request, rendered by the server's own code
    (the scheduler's prompt preparation and chat template)."""

    def __init__(self, model_dir: Path, tokenizer: AutoTokenizer) -> None:
        self.text = TargetText.load(str(model_dir))
        self.tokenizer = tokenizer

    def prompt(self, messages: list[dict]) -> list[int]:
        chat = ChatFormat(history=tuple((m["role"], m["content"]) for m in messages[:-1]))
        prepared = prepare_prompt(messages[-1]["content"], "infobench", chat)
        rendered = self.text.model_text(prepared.model_prompt, prepared.chat)
        return self.tokenizer.encode(rendered, add_special_tokens=False)

    def answer(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)


def reachable_rate(records: list[dict], tokens: ServedTokens) -> float:
    """The share of prompt tokens any placement could find cached, for these requests in
    the order they were sent: what one instance with an endless pool would find
    (``reachable_hits``), each answer's tokens left named after its prompt."""
    served = []
    for record in sorted(records, key=lambda r: r["sent_s"]):
        prompt = tokens.prompt(record["messages"])
        if len(prompt) != record["prompt_tokens"]:
            logger.warning(
                "rendered %d prompt tokens, the server counted %d", len(prompt), record["prompt_tokens"]
            )
        served.append((prompt, [*prompt, *tokens.answer(record["answer"])]))
    hits = reachable_hits(served, KV_BLOCK_SIZE)
    return sum(hits) / sum(len(prompt) for prompt, _ in served)


def summarise(records: list[dict], elapsed: float, hit: float, miss: float, sla: tuple[float, float]) -> dict:
    ttft = sorted(r["ttft_s"] for r in records)
    good = [
        r
        for r in records
        if r["ttft_s"] <= sla[0] and (r["e2e_s"] - r["ttft_s"]) / max(1, r["completion_tokens"] - 1) <= sla[1]
    ]
    per_turn = {}
    for turn in sorted({r["turn"] for r in records}):
        per_turn[turn] = statistics.median(r["ttft_s"] for r in records if r["turn"] == turn)
    return {
        "requests": len(records),
        "refusals": sum(r["refusals"] for r in records),
        "ttft_p50_s": statistics.median(ttft),
        "ttft_p95_s": ttft[min(len(ttft) - 1, int(0.95 * len(ttft)))],
        "ttft_p50_by_turn_s": per_turn,
        "tokens_per_s": sum(r["completion_tokens"] for r in records) / elapsed,
        "goodput_per_s": len(good) / elapsed,
        "prompt_tokens": sum(r["prompt_tokens"] for r in records),
        "hit_tokens": hit,
        "miss_tokens": miss,
        "hit_rate": hit / (hit + miss) if hit + miss else 0.0,
        "seconds": elapsed,
    }


def run_setup(
    setup: str, workloads: dict[str, list[Conversation]], tokens: ServedTokens, args: argparse.Namespace
) -> tuple[list, dict]:
    """One server with ``setup``'s settings through both workloads: (rows, answers)."""
    rows, answers = [], {}
    with (
        tempfile.TemporaryDirectory() as logs,
        local_pipeline(Path(logs), SETUPS[setup]) as (url, _, metrics),
    ):
        warm = [Conversation("You are brief.", ("Say hello.",), 4)] * 4
        asyncio.run(closed_loop(url, warm, 2))  # both instances past their first step
        with urllib.request.urlopen(metrics, timeout=10) as reply:
            free = metric_sum(reply.read().decode(), "specbatch_free_kv_blocks")
        logger.info("%s: %.0f free KV blocks over both instances", setup, free)
        for workload, conversations in workloads.items():
            before = counters(metrics)
            records, elapsed = asyncio.run(closed_loop(url, conversations, args.concurrency))
            hit, miss = settled_counters(metrics, before, sum(r["prompt_tokens"] for r in records))
            row = summarise(records, elapsed, hit, miss, (args.sla_ttft_ms / 1000, args.sla_tpot_ms / 1000))
            row.update(setup=setup, workload=workload, reachable_hit_rate=reachable_rate(records, tokens))
            rows.append(row)
            answers[workload] = sorted((r["conversation"], r["turn"], r["answer"]) for r in records)
            logger.info(
                "%s / %s: %s", setup, workload, {k: v for k, v in row.items() if k != "ttft_p50_by_turn_s"}
            )
    return rows, answers


def medians(rows: list[dict]) -> list[dict]:
    """Per set-up and workload, the median of each figure over the rounds."""
    merged = []
    for setup in SETUPS:
        for workload in WORKLOADS:
            runs = [r for r in rows if (r["setup"], r["workload"]) == (setup, workload)]
            row = {"setup": setup, "workload": workload, "rounds": len(runs)}
            for key, value in runs[0].items():
                if isinstance(value, (int, float)) and key not in row:
                    row[key] = statistics.median(r[key] for r in runs)
            turns = runs[0]["ttft_p50_by_turn_s"]
            row["ttft_p50_by_turn_s"] = {
                t: statistics.median(r["ttft_p50_by_turn_s"][t] for r in runs) for t in turns
            }
            merged.append(row)
    return merged


def ratios(rows: list[dict]) -> dict:
    def get(setup: str, workload: str) -> dict:
        return next(r for r in rows if (r["setup"], r["workload"]) == (setup, workload))

    tenants, chat = "tenant_system_prompts", "multi_turn_chat"
    result = {
        "tenant ttft p50 off / prefix aware": get("reuse off", tenants)["ttft_p50_s"]
        / get("prefix aware", tenants)["ttft_p50_s"],
        "tenant tokens/s prefix aware / off": get("prefix aware", tenants)["tokens_per_s"]
        / get("reuse off", tenants)["tokens_per_s"],
        "chat turn-4 ttft p50 off / prefix aware": get("reuse off", chat)["ttft_p50_by_turn_s"][4]
        / get("prefix aware", chat)["ttft_p50_by_turn_s"][4],
    }
    for workload in WORKLOADS:
        loaded = get("least loaded", workload)
        result[f"{workload} most any placement could find / least loaded's hit rate"] = loaded[
            "reachable_hit_rate"
        ] / max(loaded["hit_rate"], 1e-9)
        for placement in ("prefix aware", "holder until full"):
            aware = get(placement, workload)
            result[f"{workload} hit rate {placement} / least loaded"] = aware["hit_rate"] / max(
                loaded["hit_rate"], 1e-9
            )
            result[f"{workload} goodput {placement} / least loaded"] = aware["goodput_per_s"] / max(
                loaded["goodput_per_s"], 1e-9
            )
    return result


def same_answers(answers: dict[str, dict[str, list]]) -> float:
    """The share of (set-up, turn) answers equal to reuse off's for the same turn. Float32
    greedy decoding may round differently in another batch and flip a near-tie."""
    reference = [a for workload in WORKLOADS for a in answers["reuse off"][workload]]
    others = [
        a == b
        for setup in SETUPS
        if setup != "reuse off"
        for a, b in zip([a for w in WORKLOADS for a in answers[setup][w]], reference, strict=True)
    ]
    return sum(others) / len(others)


def plot(rows: list[dict], path: Path) -> Path:
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 3, figsize=(14, 4))
    width = 0.8 / len(SETUPS)
    for index, setup in enumerate(SETUPS):
        offset = (index - (len(SETUPS) - 1) / 2) * width
        mine = [next(r for r in rows if (r["setup"], r["workload"]) == (setup, w)) for w in WORKLOADS]
        axes[0].bar(
            [i + offset for i in range(len(WORKLOADS))], [r["hit_rate"] for r in mine], width, label=setup
        )
        axes[1].bar(
            [i + offset for i in range(len(WORKLOADS))], [r["ttft_p50_s"] for r in mine], width, label=setup
        )
        if setup == "least loaded":
            axes[0].scatter(
                range(len(WORKLOADS)),
                [r["reachable_hit_rate"] for r in mine],
                marker="_",
                s=900,
                color="black",
                label="most any placement could find",
                zorder=3,
            )
        turns = mine[1]["ttft_p50_by_turn_s"]
        axes[2].plot([int(t) for t in turns], list(turns.values()), marker="o", label=setup)
    for axis, title in zip(axes[:2], ("prompt tokens found cached", "first token p50 (s)"), strict=True):
        axis.set_xticks(range(len(WORKLOADS)), ["tenant system prompts", "multi-turn chat"])
        axis.set_title(title)
        axis.legend(fontsize=7, loc="upper right", ncol=2)
    axes[0].set_ylim(0, 1.2)
    axes[2].set_xlabel("turn")
    axes[2].set_title("multi-turn chat: first token p50 (s) per turn")
    axes[2].legend(fontsize=8)
    figure.suptitle("Prefix reuse and placement through the server, two CPU instances (tiny pair)")
    return save_figure(figure, path)


def print_tables(rows: list[dict], found: dict) -> None:
    print(
        "| workload | set-up | requests | first token p50 (s) | p95 (s) | tokens/s | goodput (req/s) ", end=""
    )
    print("| hit rate | most any placement could find | refused (503, retried) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['workload']} | {r['setup']} | {r['requests']:.0f} | {r['ttft_p50_s']:.3f} "
            f"| {r['ttft_p95_s']:.3f} "
            f"| {r['tokens_per_s']:.1f} | {r['goodput_per_s']:.2f} | {r['hit_rate']:.1%} "
            f"| {r['reachable_hit_rate']:.1%} "
            f"| {r['refusals']:.0f} |"
        )
    print("\n| multi-turn chat, first token p50 (s) by turn | " + " | ".join(SETUPS) + " |")
    print("|---|" + "---|" * len(SETUPS))
    chat = {r["setup"]: r["ttft_p50_by_turn_s"] for r in rows if r["workload"] == "multi_turn_chat"}
    for turn in chat["reuse off"]:
        print(f"| {turn} | " + " | ".join(f"{chat[s][turn]:.3f}" for s in SETUPS) + " |")
    print()
    for name, value in found.items():
        print(f"- {name}: {value:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="one round, fewer requests and conversations")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 3, 1 with --quick)")
    parser.add_argument("--requests", type=int, help="tenant requests (default 96, 48 with --quick)")
    parser.add_argument("--tenants", type=int, default=24, help="distinct system prompts")
    parser.add_argument("--conversations", type=int, help="chat conversations (default 16, 8 with --quick)")
    parser.add_argument("--concurrency", type=int, default=8, help="conversations open at a time")
    parser.add_argument("--think-s", type=float, default=1.0, help="mean pause between chat turns")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--sla-ttft-ms", type=float, default=2000, help="the cpu config's sla_ttft_ms")
    parser.add_argument("--sla-tpot-ms", type=float, default=50, help="the cpu config's sla_tpot_ms")
    parser.add_argument("--out", type=Path, help="write the rows as JSON here")
    parser.add_argument("--plot", type=Path, default=Path("docs/img/bench_prefix_serving.png"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    for transport in ("httpx", "httpx2"):  # the openai client's transport: a line per request otherwise
        logging.getLogger(transport).setLevel(logging.WARNING)
    rounds = args.rounds or (1 if args.quick else 3)
    text = Text(ROOT / ".models/tiny/target", seed=11)
    tokens = ServedTokens(ROOT / ".models/tiny/target", text.tokenizer)
    workloads = {
        "tenant_system_prompts": tenant_workload(
            text, args.requests or (48 if args.quick else 96), args.tenants, args.max_tokens
        ),
        "multi_turn_chat": chat_workload(
            text, args.conversations or (8 if args.quick else 16), args.max_tokens, args.think_s
        ),
    }
    rows, answers = [], {}
    for round_index in range(rounds):
        for setup in SETUPS:
            logger.info("round %d/%d: %s", round_index + 1, rounds, setup)
            setup_rows, answers[setup] = run_setup(setup, workloads, tokens, args)
            rows.extend({**row, "round": round_index} for row in setup_rows)
    summary = medians(rows)
    found = ratios(summary)
    found["share of greedy answers equal to reuse off's (last round)"] = same_answers(answers)
    print_tables(summary, found)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        result = {
            "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
            "settings": {k: str(v) for k, v in vars(args).items()} | {"rounds": rounds},
            "runs": rows,
            "medians": summary,
            "ratios": found,
        }
        args.out.write_text(json.dumps(result, indent=2))
    print(f"plot: {plot(summary, args.plot)}")


if __name__ == "__main__":
    main()

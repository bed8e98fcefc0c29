"""`specbatch-client "prompt" ...`: send prompts to a running specbatch server and print the answers."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specbatch_client.api import GenerationOptions, ServerError, SpecbatchClient

DEFAULT_URLS = {"http": "localhost:8000", "grpc": "localhost:8001"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specbatch-client", description=__doc__)
    parser.add_argument("prompts", nargs="*", help="prompts, answered in order")
    parser.add_argument("--file", type=Path, help="a file of prompts separated by lines holding only '---'")
    parser.add_argument("--protocol", choices=("http", "grpc"), default="http")
    parser.add_argument("--url", help="host:port (default localhost:8000 for http, localhost:8001 for grpc)")
    parser.add_argument("--max-tokens", type=int)
    parser.add_argument("--temperature", type=float)
    parser.add_argument("--top-p", type=float)
    parser.add_argument("--top-k", type=int)
    parser.add_argument("--min-p", type=float, help="drop tokens under this share of the likeliest")
    parser.add_argument("--task", choices=("graph", "mmlu", "infobench"), help="skip routing")
    parser.add_argument("--seed", type=int, help="random_seed: a sampled answer the same on every call")
    parser.add_argument(
        "--ignore-eos", action="store_true", default=None, help="run every answer to --max-tokens"
    )
    parser.add_argument("--min-tokens", type=int, help="no answer ends before this many tokens")
    parser.add_argument(
        "--logprobs", type=int, help="print each token's log-probability and this many alternatives"
    )
    parser.add_argument("--presence-penalty", type=float, help="on tokens already in the answer (-2 to 2)")
    parser.add_argument("--frequency-penalty", type=float, help="per occurrence in the answer (-2 to 2)")
    parser.add_argument("--repetition-penalty", type=float, help="on prompt and answer tokens (> 1: fewer)")
    parser.add_argument("--stop", action="append", help="end the answer before this string (repeatable)")
    parser.add_argument(
        "--include-stop-str",
        action="store_true",
        default=None,
        help="end the answer after the stop string instead of before it",
    )
    parser.add_argument(
        "--stop-token-id", type=int, action="append", help="end the answer at this token id (repeatable)"
    )
    parser.add_argument(
        "--logit-bias",
        type=parse_logit_bias,
        action="append",
        metavar="ID=VALUE",
        help="add VALUE (-100 to 100) to token ID's logit (repeatable)",
    )
    args = parser.parse_args(argv)

    prompts = list(args.prompts)
    if args.file:
        prompts += [p.strip("\n") for p in args.file.read_text().split("\n---\n") if p.strip()]
    if not prompts:
        parser.error("give prompts as arguments or with --file")
    client = SpecbatchClient(args.url or DEFAULT_URLS[args.protocol], args.protocol)
    options = GenerationOptions(
        args.max_tokens,
        args.temperature,
        args.top_p,
        args.top_k,
        args.task,
        random_seed=args.seed,
        ignore_eos=args.ignore_eos,
        min_tokens=args.min_tokens,
        logprobs=args.logprobs,
        min_p=args.min_p,
        presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty,
        repetition_penalty=args.repetition_penalty,
        stop=args.stop,
        include_stop_str_in_output=args.include_stop_str,
        stop_token_ids=args.stop_token_id,
        logit_bias=dict(args.logit_bias) if args.logit_bias else None,
    )
    try:
        answers = client.generate(prompts, options)
    except ServerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for index, answer in enumerate(answers):
        print(
            f"[{index}] task={answer.task} finish={answer.finish_reason} "
            f"tokens={answer.num_input_tokens}->{answer.num_output_tokens} "
            f"acceptance={answer.acceptance_rate:.2f}"
        )
        print((answer.error and f"error: {answer.error}") or answer.text)
        for entry in answer.token_logprobs or ():
            others = " ".join(f"{a['token']!r}:{a['logprob']:.3f}" for a in entry["top_logprobs"])
            print(f"  {entry['token']!r} {entry['logprob']:.3f}  {others}".rstrip())
    return 0 if all(not a.error for a in answers) else 2


def parse_logit_bias(text: str) -> tuple[int, float]:
    """`--logit-bias 1234=-100` as (1234, -100.0)."""
    token, _, value = text.partition("=")
    try:
        return int(token), float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected ID=VALUE, got {text!r}") from None


if __name__ == "__main__":
    sys.exit(main())

"""The `specbatch` command: serve the pipeline, build the embedded tiny models (or the
production-shaped random pair), or run tritonserver watched from inside its container."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from specbatch.server.launcher import CONFIG_VARIANTS, PRODUCTION_SHAPES_DIR, project_root, serve
from specbatch.server.ports import PortInUseError, Ports


def watch(server_command: list[str], notify_urls: list[str]) -> int:
    """`specbatch watch`: the command after ``--`` run and its stubs watched (see server.watch)."""
    from specbatch.server.admin import ADMIN_KEY_ENV, admin_key
    from specbatch.server.watch import run_watched

    command = server_command[1:] if server_command[:1] == ["--"] else server_command
    if not command:
        print("specbatch watch: give the server command after --", file=sys.stderr)
        return 2
    if not os.environ.get(ADMIN_KEY_ENV):
        print(f"specbatch watch: models are brought back through the repository API: set {ADMIN_KEY_ENV} "
              "to the key tritonserver's restricted APIs take", file=sys.stderr)
        return 2
    return run_watched(command, admin_key(), notify_urls)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specbatch", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    serve_cmd = commands.add_parser("serve", help="start tritonserver with the specbatch pipeline")
    serve_cmd.add_argument(
        "--config",
        choices=CONFIG_VARIANTS,
        default="auto",
        help="model-config variant: auto picks default (2 GPUs), gpu1 (1 GPU) or cpu; "
        "cpu_production_shapes serves the production-shaped random pair in bf16 on CPU",
    )
    serve_cmd.add_argument(
        "--host",
        default="127.0.0.1",
        help="address the HTTP, gRPC, metrics and OpenAI endpoints bind (default loopback only; "
        "0.0.0.0 for every interface, as in the container)",
    )
    serve_cmd.add_argument("--http-port", type=int, default=8000)
    serve_cmd.add_argument("--grpc-port", type=int, default=8001)
    serve_cmd.add_argument("--metrics-port", type=int, default=8002)
    serve_cmd.add_argument("--log-verbose", type=int, default=0)
    serve_cmd.add_argument(
        "--openai-port", type=int, default=9000, help="port of the OpenAI-compatible front (/v1)"
    )
    serve_cmd.add_argument("--no-openai", action="store_true", help="do not start the OpenAI front")

    build_cmd = commands.add_parser("build-models", help="build the deterministic tiny Qwen3 pair")
    build_cmd.add_argument(
        "--out",
        type=Path,
        default=None,
        help="directory (default: <checkout>/.models/tiny, or .models/production_shapes)",
    )
    build_cmd.add_argument(
        "--production-shapes",
        action="store_true",
        help="instead: random weights of Qwen3-0.6B's shapes and a 4-layer Qwen3-8B, sharded bf16 "
        "safetensors with a tokenizer of Qwen3's size (about 5 GB; the cpu_production_shapes config)",
    )

    watch_cmd = commands.add_parser(
        "watch",
        help="run tritonserver (the command after --) and bring back any model whose stub process "
        "dies: the container entry point where nothing else can see Triton's processes (KServe)",
    )
    watch_cmd.add_argument(
        "--notify",
        action="append",
        default=[],
        metavar="URL",
        help="POST here when the scheduler dies (the gateway's --control-port); repeatable",
    )
    watch_cmd.add_argument("server_command", nargs=argparse.REMAINDER, help="-- tritonserver ARGS...")

    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if args.command == "serve":
        try:
            return serve(
                args.config,
                Ports(args.http_port, args.grpc_port, args.metrics_port),
                args.host,
                args.log_verbose,
                openai_port=None if args.no_openai else args.openai_port,
            )
        except PortInUseError as exc:
            print(f"specbatch serve: {exc}", file=sys.stderr)
            return 1
    if args.command == "watch":
        return watch(args.server_command, args.notify)
    if args.production_shapes:
        from specbatch.decoding.production_shapes import build_production_shapes

        target, draft = build_production_shapes(args.out or project_root() / PRODUCTION_SHAPES_DIR)
    else:
        from specbatch.decoding import build_tiny_pair

        target, draft = build_tiny_pair(args.out or project_root() / ".models" / "tiny")
    print(f"target: {target}\ndraft:  {draft}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

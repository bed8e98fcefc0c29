"""`python -m specbatch.openai`: the OpenAI-compatible front, forwarding to a running tritonserver."""

from __future__ import annotations

import argparse
import logging

from aiohttp import web

from specbatch.openai.app import build_app


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m specbatch.openai", description=__doc__)
    parser.add_argument("--grpc-url", default="localhost:8001", help="tritonserver's gRPC endpoint")
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default loopback; 0.0.0.0 for every interface)"
    )
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument(
        "--model-name",
        action="append",
        help="a model name clients may ask for (repeatable; default: specbatch)",
    )
    parser.add_argument(
        "--max-pending", type=int, default=256, help="requests in flight before new ones get 503"
    )
    parser.add_argument(
        "--shutdown-timeout", type=float, default=30.0, help="seconds in-flight requests get on SIGTERM"
    )
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    app = build_app(args.grpc_url, args.model_name or ["specbatch"], args.max_pending)
    web.run_app(
        app,
        host=args.host,
        port=args.port,
        handler_cancellation=True,
        shutdown_timeout=args.shutdown_timeout,
        access_log=None,
        print=lambda message: logging.getLogger("specbatch.openai").info(message),
    )


if __name__ == "__main__":
    main()

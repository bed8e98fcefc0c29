"""`specbatch watch`: tritonserver's port read from its command, its exit status passed on,
a dead scheduler announced to the gateway's control port (which answers what it held)."""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from aiohttp import ClientSession

from specbatch.cli import main
from specbatch.gateway.__main__ import start_control
from specbatch.server.ports import free_port
from specbatch.server.watch import http_port_of, notify, run_watched


@pytest.mark.parametrize(
    ("command", "port"),
    [
        (["tritonserver", "--http-port=8090", "--grpc-port=8091"], 8090),
        (["tritonserver", "--http-port", "8010"], 8010),
        (["tritonserver", "--model-repository=/models"], 8000),
    ],
)
def test_the_http_port_is_the_one_tritonserver_is_given(command, port):
    assert http_port_of(command) == port


def test_the_servers_exit_status_is_the_watchers():
    key = "k" * 32
    assert run_watched([sys.executable, "-c", "raise SystemExit(3)"], key) == 3
    killed = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]
    assert run_watched(killed, key) == 128 + signal.SIGKILL


def test_each_url_is_told_once_and_one_that_does_not_answer_is_skipped():
    told: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            told.append(self.path)
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            """Quiet."""

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        nobody = f"http://127.0.0.1:{free_port()}/scheduler-lost"
        notify([nobody, f"http://127.0.0.1:{server.server_port}/scheduler-lost"])
    finally:
        server.shutdown()
        server.server_close()
    assert told == ["/scheduler-lost"]


def test_the_gateway_hears_of_a_dead_scheduler_on_its_loopback_control_port():
    lost = []

    async def scenario() -> None:
        port = free_port()
        runner = await start_control(port, lambda: lost.append(True))
        try:
            async with ClientSession() as session:
                async with session.post(f"http://127.0.0.1:{port}/scheduler-lost") as reply:
                    assert reply.status == 204
                async with session.get(f"http://127.0.0.1:{port}/scheduler-lost") as reply:
                    assert reply.status == 405
        finally:
            await runner.cleanup()

    asyncio.run(scenario())
    assert lost == [True]


def test_watch_needs_a_command_and_the_admin_key(monkeypatch, capsys):
    monkeypatch.delenv("SPECBATCH_ADMIN_KEY", raising=False)
    assert main(["watch", "--"]) == 2
    assert main(["watch", "--", "tritonserver"]) == 2
    assert "SPECBATCH_ADMIN_KEY" in capsys.readouterr().err

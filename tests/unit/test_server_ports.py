"""Free ports are chosen where no outgoing connection can take them before the server binds."""

import socket
from collections import deque
from pathlib import Path

import pytest

from specbatch.server import ports
from specbatch.server.ports import LOWEST_FREE_PORT, Ports, ephemeral_floor, free_port
from specbatch.server.process import LOOPBACK_PORT_FIELDS, ServerOptions


def test_free_ports_lie_below_the_ephemeral_range_and_bind():
    chosen = [free_port() for _ in range(50)]
    assert len(set(chosen)) == 50
    assert all(LOWEST_FREE_PORT <= port < ephemeral_floor() for port in chosen)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", chosen[-1]))


def test_a_port_something_listens_on_is_never_chosen(monkeypatch):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        offered = iter([port, port, port + 1])
        monkeypatch.setattr(ports._chooser, "randrange", lambda low, high: next(offered))
        assert free_port() == port + 1


def test_no_free_port_is_an_error_not_a_loop(monkeypatch):
    monkeypatch.setattr(ports, "can_bind", lambda host, port: False)
    with pytest.raises(OSError, match="no free port"):
        free_port()


def test_the_floor_is_read_from_the_kernel_and_defaults_when_unreadable(tmp_path):
    range_file = tmp_path / "ip_local_port_range"
    range_file.write_text("40000\t60999\n")
    assert ephemeral_floor(range_file) == 40000
    assert ephemeral_floor(tmp_path / "missing") == ports.DEFAULT_EPHEMERAL_FLOOR


def test_a_port_to_avoid_is_never_chosen(monkeypatch):
    first, second = free_port(), free_port()
    monkeypatch.setattr(ports, "_recently_given", deque())  # both on offer again
    offers = iter([first, second])
    monkeypatch.setattr(ports._chooser, "randrange", lambda low, high: next(offers))
    assert free_port(avoid={first}) == second


def test_the_loopback_listeners_never_take_a_port_the_deployment_binds_later(monkeypatch):
    public, reserved = Ports(free_port(), free_port(), free_port()), free_port()
    others = [free_port() for _ in range(4)]
    monkeypatch.setattr(ports, "_recently_given", deque())  # all on offer again
    # every choice offers a public or reserved port first, which nothing binds yet
    later = [public.http, public.grpc, reserved, public.metrics]
    offers = iter([port for pair in zip(later, others, strict=True) for port in pair])
    monkeypatch.setattr(ports._chooser, "randrange", lambda low, high: next(offers))
    options = ServerOptions(root=Path("."), ports=public, reserved_ports=(reserved,))
    chosen = [getattr(options, name) for name in LOOPBACK_PORT_FIELDS]
    assert chosen == others

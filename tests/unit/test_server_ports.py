"""Free ports are chosen where no outgoing connection can take them before the server binds."""

import socket

import pytest

from specbatch.server import ports
from specbatch.server.ports import LOWEST_FREE_PORT, ephemeral_floor, free_port


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

"""Ports for the server's listeners: the public defaults, free loopback ones (Triton's own
listeners behind the gateway, and every port a test starts a server on), and checks.

A port chosen by binding port 0 comes from the kernel's ephemeral range, the same range
every outgoing connection takes its local port from. Between the choice and the server's
bind, a client connection or a Triton stub can take it, and the server fails to start
("Failed to bind to address"). `free_port` therefore chooses below that range, where a
port is only ever taken by a process that names it.
"""

from __future__ import annotations

import random
import socket
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
DEFAULT_EPHEMERAL_FLOOR = 32768  # Linux's default when the range cannot be read
LOWEST_FREE_PORT = 10000  # above the ports services are commonly configured on
CHOICES_BEFORE_GIVING_UP = 500

_recently_given: deque[int] = deque(maxlen=1024)
_chooser = random.SystemRandom()  # independent of any seed a caller gives `random`


def ephemeral_floor(range_file: Path = EPHEMERAL_RANGE) -> int:
    """The lowest port the kernel gives to outgoing connections and to a bind of port 0."""
    try:
        return int(range_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return DEFAULT_EPHEMERAL_FLOOR


def can_bind(host: str, port: int) -> bool:
    """Whether a listener could bind `port` on `host` now, as the servers bind."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # as the servers bind: a closed connection's TIME_WAIT does not hold the port
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1", avoid: Collection[int] = ()) -> int:
    """A TCP port nothing listens on now, below the ephemeral range, not given out lately,
    and none of ``avoid``: ports this deployment will bind later, which look free until then.

    Raises OSError when none of `CHOICES_BEFORE_GIVING_UP` random choices is free.
    """
    floor = ephemeral_floor()
    if floor <= LOWEST_FREE_PORT:
        raise OSError(f"the ephemeral range starts at {floor}: no port below it to choose from")
    for _ in range(CHOICES_BEFORE_GIVING_UP):
        port = _chooser.randrange(LOWEST_FREE_PORT, floor)
        if port not in _recently_given and port not in avoid and can_bind(host, port):
            _recently_given.append(port)
            return port
    raise OSError(f"no free port between {LOWEST_FREE_PORT} and {floor} on {host}")


@dataclass(frozen=True)
class Ports:
    http: int = 8000
    grpc: int = 8001
    metrics: int = 8002

    @classmethod
    def free(cls) -> Ports:
        return cls(free_port(), free_port(), free_port())

    def named(self) -> dict[str, int]:
        return {"HTTP": self.http, "gRPC": self.grpc, "metrics": self.metrics}


class PortInUseError(RuntimeError):
    """A port the server needs is taken; the message names it."""


def check_ports_free(host: str, ports: dict[str, int]) -> None:
    """Raise PortInUseError naming the first of ``ports`` ({what: port}) that ``host`` cannot bind."""
    for what, port in ports.items():
        if not can_bind(host, port):
            raise PortInUseError(f"the {what} port {port} on {host} is in use")

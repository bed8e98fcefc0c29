"""The instance supervisor's decisions: reload while an instance survives, unload and
load when none does, retry a failed reload, and never act on the stubs it started."""

from __future__ import annotations

from specbatch.server.supervisor import InstanceSupervisor


class FakeServer:
    """Stub processes by pid, and a repository API that starts a new set of them."""

    def __init__(self) -> None:
        self.stubs = {10: "m_0_0", 11: "m_0_1"}
        self.calls: list[str] = []
        self.fail_next = False
        self._next_pid = 20

    def _new_set(self) -> None:
        for name in ("m_0_0", "m_0_1"):
            self.stubs[self._next_pid] = name
            self._next_pid += 1

    def reload(self) -> None:
        self.calls.append("reload")
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("load failed")
        self._new_set()

    def restart(self) -> None:
        self.calls.append("restart")
        self._new_set()

    def supervisor(self) -> InstanceSupervisor:
        supervisor = InstanceSupervisor(lambda: dict(self.stubs), self.reload, self.restart, retry_s=0.0)
        supervisor.check()  # the first look learns the stubs
        return supervisor


def test_nothing_happens_while_every_instance_lives() -> None:
    server = FakeServer()
    supervisor = server.supervisor()
    supervisor.check()
    assert server.calls == [] and supervisor.restarts == 0


def test_a_dead_instance_with_a_survivor_reloads_and_the_old_survivor_may_then_leave() -> None:
    server = FakeServer()
    supervisor = server.supervisor()
    del server.stubs[11]
    supervisor.check()
    assert server.calls == ["reload"] and supervisor.restarts == 1
    assert supervisor.wait_for_restarts(1, 0.0)
    del server.stubs[10]  # the retired survivor unloads: expected, not a death
    supervisor.check()
    assert server.calls == ["reload"]
    del server.stubs[21]  # one of the new set dies
    supervisor.check()
    assert server.calls == ["reload", "reload"] and supervisor.restarts == 2


def test_with_no_instance_left_the_model_is_unloaded_and_loaded() -> None:
    server = FakeServer()
    supervisor = server.supervisor()
    server.stubs.clear()
    supervisor.check()
    assert server.calls == ["restart"] and set(server.stubs) == {20, 21}


def test_a_failed_reload_is_retried_at_the_next_look() -> None:
    server = FakeServer()
    supervisor = server.supervisor()
    del server.stubs[11]
    server.fail_next = True
    supervisor.check()
    assert server.calls == ["reload"] and supervisor.restarts == 0
    assert not supervisor.wait_for_restarts(1, 0.0)
    supervisor.check()
    assert server.calls == ["reload", "reload"] and supervisor.restarts == 1

"""The supervisor's decisions: reload a model while one of its instances survives, unload
and load it when none does, retry a failed reload, bring back only the model that lost a
process, and never act on the stubs it started."""

from __future__ import annotations

import json

from specbatch.server.supervisor import StubSupervisor, model_of


class FakeServer:
    """Stub processes by pid, and a repository API that starts a new set of a model's."""

    def __init__(self) -> None:
        self.stubs = {10: "m_0_0", 11: "m_0_1", 12: "router_0_0", 13: "scheduler_0_0"}
        self.calls: list[tuple[str, str]] = []
        self.fail_next = False
        self._next_pid = 20

    def _new_set(self, model: str) -> None:
        names = ("m_0_0", "m_0_1") if model == "m" else (f"{model}_0_0",)
        for name in names:
            self.stubs[self._next_pid] = name
            self._next_pid += 1

    def reload(self, model: str) -> None:
        self.calls.append(("reload", model))
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("load failed")
        self._new_set(model)

    def restart(self, model: str) -> None:
        self.calls.append(("restart", model))
        self._new_set(model)

    def supervisor(self) -> StubSupervisor:
        supervisor = StubSupervisor(
            lambda: dict(self.stubs),
            self.reload,
            self.restart,
            retry_s=0.0,
            on_death=lambda model: self.calls.append(("died", model)),
        )
        supervisor.check()  # the first look learns the stubs
        return supervisor


def test_the_model_of_an_instance_name():
    assert model_of("qwen3_specdec_0_1") == "qwen3_specdec"
    assert model_of("scheduler_0_0") == "scheduler"


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
    assert server.calls == [("died", "m"), ("reload", "m")] and supervisor.restarts == 1
    assert supervisor.wait_for_restarts(1, 0.0)
    del server.stubs[10]  # the retired survivor unloads: expected, not a death
    supervisor.check()
    assert server.calls == [("died", "m"), ("reload", "m")]
    del server.stubs[21]  # one of the new set dies
    supervisor.check()
    assert server.calls[2:] == [("died", "m"), ("reload", "m")] and supervisor.restarts == 2


def test_with_no_instance_left_the_model_is_unloaded_and_loaded() -> None:
    server = FakeServer()
    supervisor = server.supervisor()
    del server.stubs[10], server.stubs[11]
    supervisor.check()
    assert server.calls == [("died", "m"), ("restart", "m")] and {20, 21} <= set(server.stubs)


def test_a_dead_router_or_scheduler_brings_back_that_model_alone() -> None:
    server = FakeServer()
    supervisor = server.supervisor()
    del server.stubs[13]
    supervisor.check()
    assert (
        server.calls == [("died", "scheduler"), ("restart", "scheduler")]
        and server.stubs[20] == "scheduler_0_0"
    )
    del server.stubs[12], server.stubs[20]
    supervisor.check()
    assert server.calls[2:] == [
        ("died", "router"),
        ("restart", "router"),
        ("died", "scheduler"),
        ("restart", "scheduler"),
    ]
    assert supervisor.restarted_models == ["scheduler", "router", "scheduler"]


def test_a_failed_reload_is_retried_at_the_next_look() -> None:
    server = FakeServer()
    supervisor = server.supervisor()
    del server.stubs[11]
    server.fail_next = True
    supervisor.check()
    assert server.calls == [("died", "m"), ("reload", "m")] and supervisor.restarts == 0
    assert not supervisor.wait_for_restarts(1, 0.0)
    supervisor.check()
    assert server.calls == [("died", "m"), ("reload", "m"), ("reload", "m")] and supervisor.restarts == 1, (
        "reported once"
    )


def test_a_stub_that_appears_after_the_first_look_is_watched_too() -> None:
    server = FakeServer()
    server.stubs = {}  # tritonserver still loading when the watch starts
    supervisor = server.supervisor()
    server.stubs = {30: "router_0_0"}
    supervisor.check()
    assert server.calls == []
    del server.stubs[30]
    supervisor.check()
    assert server.calls == [("died", "router"), ("restart", "router")]


def test_a_restarted_tritonserver_loads_its_models_itself_and_its_stubs_are_learnt_anew() -> None:
    server = FakeServer()
    identity = ["triton-1"]
    supervisor = StubSupervisor(
        lambda: dict(server.stubs), server.reload, server.restart, retry_s=0.0, server=lambda: identity[0]
    )
    supervisor.check()
    identity[0] = "triton-2"
    server.stubs = {40: "m_0_0", 41: "m_0_1", 42: "router_0_0", 43: "scheduler_0_0"}
    supervisor.check()
    assert server.calls == [] and supervisor.restarts == 0
    del server.stubs[43]
    supervisor.check()
    assert server.calls == [("restart", "scheduler")]


def test_a_reload_carries_the_next_restart_generation_of_the_loaded_configuration() -> None:
    from specbatch.server.stubs import ModelRestarts

    class Repository:
        def __init__(self) -> None:
            self.loaded = {"name": "m", "parameters": {"restart_generation": {"string_value": "4"}}}

        def config(self, model: str) -> dict:
            return json.loads(json.dumps(self.loaded))

        def load(self, model: str, config: dict) -> None:
            self.loaded = config

    repository = Repository()
    ModelRestarts(repository).reload("m")  # e.g. a watcher that was itself restarted
    ModelRestarts(repository).reload("m")
    assert repository.loaded["parameters"]["restart_generation"] == {"string_value": "6"}


def test_a_load_that_starts_no_new_process_is_a_failure_and_retried() -> None:
    server = FakeServer()
    supervisor = server.supervisor()
    started = server._new_set
    server._new_set = lambda model: None  # Triton took the load as a no-op
    del server.stubs[11]
    supervisor.check()
    assert supervisor.restarts == 0
    server._new_set = started
    supervisor.check()
    assert supervisor.restarts == 1 and server.calls[-2:] == [("reload", "m"), ("reload", "m")]

"""Locust users for a profile: one over the gRPC stream, one over HTTP `/generate`.

Every request is reported as Locust requests of its own types, named by the task the
prompt was drawn for, so Locust's statistics, CSV and HTML are per task and the SLA
reads them directly:

- gRPC stream user: "TTFT", "TPOT" and "gRPC E2E"
- HTTP user:        "HTTP E2E"

A failed request is one "… E2E" failure (its TTFT and TPOT are not reported), so the
failure counts of the E2E rows are the error rate the SLA checks. The response length
of an E2E record is the number of output tokens.
"""

from __future__ import annotations

import itertools
import logging
import os
import random
import time

import gevent
from locust import User, events, task
from specbatch_client import GenerationOptions, SpecbatchClient

from specbatch.loadtest.arrivals import ArrivalSchedule
from specbatch.loadtest.grpc_stream import GRPC_HOST_ENV, StreamingGenerateClient
from specbatch.loadtest.profiles import PROFILE_ENV, LoadProfile, ProfileError, load_profile
from specbatch.loadtest.prompts import PromptPool, build_prompt_pool
from specbatch.loadtest.sla import GRPC_E2E, HTTP_E2E, TPOT, TTFT
from specbatch.loadtest.timing import latency_figures

DEFAULT_GRPC_HOST = "127.0.0.1:8001"

logger = logging.getLogger(__name__)


class _TestClock:
    """Seconds since the test started, shared by every user so burst phases line up."""

    origin = time.monotonic()

    @classmethod
    def restart(cls, **_kwargs: object) -> None:
        cls.origin = time.monotonic()

    @classmethod
    def now(cls) -> float:
        return time.monotonic() - cls.origin


events.test_start.add_listener(_TestClock.restart)


def profile_from_environment() -> LoadProfile:
    """The profile named by $SPECBATCH_LOADTEST_PROFILE (how the runner hands it to Locust)."""
    path = os.environ.get(PROFILE_ENV)
    if not path:
        raise ProfileError(f"set {PROFILE_ENV} to a load-test profile, e.g. loadtest/profiles/smoke.yaml")
    return load_profile(path)


class _ProfiledUser(User):
    """Draws prompts by the profile's mix and paces requests by its arrival schedule."""

    abstract = True
    profile: LoadProfile
    pool: PromptPool
    _user_numbers = itertools.count()

    def on_start(self) -> None:
        number = next(_ProfiledUser._user_numbers)
        self.rng = random.Random(f"{self.profile.workload.prompts.seed}:{number}")
        self.arrivals = ArrivalSchedule(self.profile.workload.arrival, self.profile.workload.users, self.rng)
        self.wait_time = lambda: self.arrivals.wait(_TestClock.now())
        self.wait()

    def _record(
        self,
        request_type: str,
        task: str,
        milliseconds: float,
        length: int = 0,
        exception: Exception | None = None,
    ) -> None:
        self.environment.events.request.fire(
            request_type=request_type,
            name=task,
            response_time=milliseconds,
            response_length=length,
            exception=exception,
            context={},
        )


class GenerationFailed(RuntimeError):
    """The server answered the prompt with an error or a cancellation."""


class GrpcStreamUser(_ProfiledUser):
    """Streams one prompt at a time over its own gRPC stream; TTFT, TPOT and end-to-end per task."""

    abstract = True

    def on_start(self) -> None:
        url = os.environ.get(GRPC_HOST_ENV, DEFAULT_GRPC_HOST)
        _resize_gevent_threadpool(+1)
        self.client = StreamingGenerateClient(url, timeout_s=self.profile.workload.request_timeout_s)
        super().on_start()

    def on_stop(self) -> None:
        self.client.close()
        _resize_gevent_threadpool(-1)

    @task
    def generate(self) -> None:
        choice = self.pool.draw(self.rng)
        start = time.monotonic()
        try:
            generation = self.client.generate(
                choice.text, choice.max_tokens, ignore_eos=self.profile.workload.ignore_eos
            )
        except Exception as exc:
            self._record(GRPC_E2E, choice.task, (time.monotonic() - start) * 1000.0, exception=exc)
            return
        figures = latency_figures(
            generation.start, generation.first_delta, generation.end, generation.output_tokens
        )
        if generation.failed:
            reason = generation.error or f"finish_reason {generation.finish_reason}"
            self._record(GRPC_E2E, choice.task, figures.e2e_ms, exception=GenerationFailed(reason))
            return
        if not figures.streamed:
            _warn_no_deltas_once(choice.task)
        self._record(TTFT, choice.task, figures.ttft_ms)
        if figures.tpot_ms is not None:
            self._record(TPOT, choice.task, figures.tpot_ms)
        self._record(GRPC_E2E, choice.task, figures.e2e_ms, length=generation.output_tokens)


class HttpGenerateUser(_ProfiledUser):
    """Posts one prompt at a time to `/v2/models/specbatch/generate`; end-to-end per task."""

    abstract = True

    def on_start(self) -> None:
        if not self.host:
            raise ValueError("the HTTP user needs --host http://HOST:PORT")
        self.client = SpecbatchClient(self.host, "http", timeout_s=self.profile.workload.request_timeout_s)
        super().on_start()

    @task
    def generate(self) -> None:
        choice = self.pool.draw(self.rng)
        options = GenerationOptions(
            max_tokens=choice.max_tokens, ignore_eos=self.profile.workload.ignore_eos or None
        )
        start = time.monotonic()
        try:
            (answer,) = self.client.generate(choice.text, options)
        except Exception as exc:
            self._record(HTTP_E2E, choice.task, (time.monotonic() - start) * 1000.0, exception=exc)
            return
        elapsed_ms = (time.monotonic() - start) * 1000.0
        if answer.error or answer.finish_reason in ("error", "cancelled"):
            reason = answer.error or f"finish_reason {answer.finish_reason}"
            self._record(HTTP_E2E, choice.task, elapsed_ms, exception=GenerationFailed(reason))
            return
        self._record(HTTP_E2E, choice.task, elapsed_ms, length=answer.num_output_tokens)


def _resize_gevent_threadpool(change: int) -> None:
    """Give each open gRPC stream its own thread in gevent's hub pool.

    Under gevent, grpcio polls every channel from a thread of that pool, which holds 10
    by default. Past that, a channel waits for a free thread and every response it
    carries arrives hundreds of milliseconds late: measured with 13 open streams, a graph
    answer took a median 364 ms in the Locust process against 8 ms outside it.
    """
    pool = gevent.get_hub().threadpool
    pool.maxsize = max(1, pool.maxsize + change)


_tasks_without_deltas: set[str] = set()


def _warn_no_deltas_once(task_name: str) -> None:
    if task_name not in _tasks_without_deltas:
        _tasks_without_deltas.add(task_name)
        logger.warning(
            "%s: the server sent no text deltas, so TTFT falls back to end-to-end and TPOT to "
            "end-to-end / tokens",
            task_name,
        )


def configure_user_classes(profile: LoadProfile) -> list[type[User]]:
    """Arm the user classes the profile's clients weigh in (weight, prompts); the others stay abstract."""
    pool = build_prompt_pool(profile.workload)
    classes = {"grpc_stream": GrpcStreamUser, "http": HttpGenerateUser}
    armed = []
    for client, user_class in classes.items():
        weight = profile.workload.clients.get(client, 0)
        user_class.abstract = weight == 0
        user_class.weight = weight
        user_class.profile = profile
        user_class.pool = pool
        if weight:
            armed.append(user_class)
    return armed

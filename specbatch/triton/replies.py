"""A client request's response sender, as the scheduler core's ReplySink.

Streamed text goes out as one delta response per piece; the final response carries
every prompt's outcome in input order. A request whose only prompt failed, or that was
cancelled, is answered with a TritonError instead, so clients see the error they expect.
"""

from __future__ import annotations

import contextlib
import logging

import triton_python_backend_utils as pb_utils

from specbatch.serving.faults import InjectedFault
from specbatch.serving.scheduler.outputs import delta_arrays, outcome_arrays
from specbatch.serving.wire import RowOutcome
from specbatch.triton.tensors import error_response, response

logger = logging.getLogger(__name__)
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonReply:
    def __init__(self, request, sender, stream: bool, fault: bool = False) -> None:
        """``fault``: one of the request's prompts asked for an injected reply fault."""
        self._request = request
        self._sender = sender
        self._stream = stream
        self._fault = fault

    def delta(self, index: int, task: str, text: str) -> None:
        try:
            self._sender.send(response(delta_arrays(index, task, text), batched=True))
        except Exception:
            logger.warning("sending a stream delta failed (client gone?)", exc_info=True)

    def final(self, outcomes: list[RowOutcome]) -> None:
        try:
            self._send_final(outcomes)
        except Exception as exc:
            logger.exception("building the final response failed; answering with the error")
            with contextlib.suppress(Exception):
                self._sender.send(error_response(f"the server failed to answer: {exc}"), flags=FINAL)

    def _send_final(self, outcomes: list[RowOutcome]) -> None:
        if self._fault:
            raise InjectedFault("injected reply fault")
        if all(o.finish_reason == "cancelled" for o in outcomes):
            final = error_response(outcomes[0].error, cancelled=True)
        elif len(outcomes) == 1 and outcomes[0].error:
            final = error_response(outcomes[0].error)
        else:
            final = response(outcome_arrays(outcomes, with_text=not self._stream), batched=True)
        try:
            self._sender.send(final, flags=FINAL)
        except Exception:
            logger.exception("sending a response failed (client gone?)")

    def is_cancelled(self) -> bool:
        return self._request.is_cancelled()

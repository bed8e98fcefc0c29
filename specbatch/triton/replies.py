"""A client request's response sender, as the scheduler core's ReplySink.

Streamed text goes out as one delta response per piece; the final response carries
every prompt's outcome in input order. A request whose only prompt failed, or that was
cancelled, is answered with a TritonError instead, so clients see the error they expect.
"""

from __future__ import annotations

import contextlib
import logging

from specbatch.serving.faults import FaultHooks
from specbatch.serving.messages import RowOutcome
from specbatch.triton.outputs import delta_arrays, outcome_arrays
from specbatch.triton.tensors import FINAL, error_response, response

logger = logging.getLogger(__name__)


class TritonReply:
    def __init__(self, request, sender, stream: bool, faults: FaultHooks) -> None:
        self._request = request
        self._sender = sender
        self._stream = stream
        self._faults = faults

    def delta(self, index: int, task: str, text: str, logprobs: str = "") -> None:
        try:
            self._sender.send(response(delta_arrays(index, task, text, logprobs), batched=True))
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
        self._faults.before_final(self)
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

"""Errors in OpenAI's format (`{"error": {"message", "type", "param", "code"}}`) and status codes.

Triton's gRPC stream carries only an error's message, not its status code, so an
error from the pipeline is classified by what it says: overload and an unreachable
server are 503 (retry later), a deadline is 504, anything else about the request 400.
"""

from __future__ import annotations

from specbatch.serving.availability import is_unavailable


class OpenAIError(Exception):
    """A request the front answers with an HTTP error status and OpenAI's error body."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": "invalid_request_error" if 400 <= self.status < 500 else "server_error",
                "param": self.param,
                "code": self.code,
            }
        }


def bad_request(message: str, param: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, param=param)


def from_pipeline(message: str) -> OpenAIError:
    """The HTTP error for an error message the pipeline answered with."""
    if is_unavailable(message):
        return OpenAIError(503, message, code="overloaded")
    if "deadline" in message.lower():
        return OpenAIError(504, message, code="deadline_exceeded")
    return OpenAIError(400, message)

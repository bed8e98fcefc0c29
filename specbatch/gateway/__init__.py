"""The HTTP front on the ports users reach, with Triton's HTTP and metrics behind it on loopback."""

from specbatch.gateway.app import DEFAULT_MAX_BODY, MAX_BODY_CEILING, build_app

__all__ = ["DEFAULT_MAX_BODY", "MAX_BODY_CEILING", "build_app"]

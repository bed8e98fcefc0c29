"""Triton's administrative APIs, closed to every caller without the admin key.

tritonserver serves its administrative APIs on the same ports as inference and, by
default, to anyone who can reach them: a client could unload the model, register shared
memory regions, or point the server's log or trace file at any path it can write.
Triton 2.51 restricts a group of APIs to requests carrying a header (HTTP) or metadata
entry (gRPC) with a given value; every start command this project ships passes that
restriction. The key comes from SPECBATCH_ADMIN_KEY, or is generated at random for one
server's lifetime, and the launcher keeps it so that it can still use the repository API
itself (to load or reload a model).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import urllib.error
import urllib.request
from collections.abc import Mapping

ADMIN_KEY_ENV = "SPECBATCH_ADMIN_KEY"
# gRPC metadata keys are lower case; HTTP headers are matched case-insensitively.
ADMIN_HEADER = "specbatch-admin-key"
# Triton's gRPC server looks for the restricted header under this prefix.
GRPC_ADMIN_HEADER = f"triton-grpc-protocol-{ADMIN_HEADER}"
# model-repository: index, load, unload (model control). The others write server state
# or files: shared-memory registration, log settings, trace settings.
RESTRICTED_APIS = ("model-repository", "shared-memory", "logging", "trace")
# Triton splits the flag on ':', ',' and '='; a key made of URL-safe characters passes intact.
_KEY_PATTERN = re.compile(r"[A-Za-z0-9_.~-]{16,256}")


class AdminKeyError(ValueError):
    """An admin key that is too short or holds characters Triton's flag parser splits on."""


class AdminRequestError(RuntimeError):
    """The server refused or failed an administrative request; the message carries its answer."""


def admin_key(env: Mapping[str, str] | None = None) -> str:
    """The configured admin key, or a fresh random one when SPECBATCH_ADMIN_KEY is unset or empty."""
    configured = (os.environ if env is None else env).get(ADMIN_KEY_ENV, "")
    if not configured:
        return secrets.token_urlsafe(32)
    if not _KEY_PATTERN.fullmatch(configured):
        raise AdminKeyError(
            f"{ADMIN_KEY_ENV} must be 16 to 256 characters from A-Z a-z 0-9 _ . ~ - "
            "(e.g. the output of `openssl rand -hex 32`)"
        )
    return configured


def restriction_arguments(key: str) -> list[str]:
    """The tritonserver flags that restrict RESTRICTED_APIS to callers sending `key`."""
    if not _KEY_PATTERN.fullmatch(key):
        raise AdminKeyError("admin key must be 16 to 256 characters from A-Z a-z 0-9 _ . ~ -")
    apis = ",".join(RESTRICTED_APIS)
    return [
        f"--http-restricted-api={apis}:{ADMIN_HEADER}={key}",
        f"--grpc-restricted-protocol={apis}:{ADMIN_HEADER}={key}",
    ]


class RepositoryClient:
    """Triton's HTTP model-repository API (index, load, unload) with the admin key attached."""

    def __init__(self, http_url: str, key: str, timeout_s: float = 60.0) -> None:
        self.base = http_url if http_url.startswith("http") else f"http://{http_url}"
        self.key = key
        self.timeout_s = timeout_s

    def index(self) -> list[dict]:
        """Every model in the repositories with its state ("READY", "UNAVAILABLE", ...)."""
        return json.loads(self._post("/v2/repository/index") or b"[]")

    def load(self, model: str, config: dict | None = None) -> None:
        """Load `model` from its repository; needs --model-control-mode=explicit. With
        `config`, load it with that configuration, even if it is loaded already with the
        same one (a plain load of an unchanged, loaded model does nothing)."""
        body = {"parameters": {"config": json.dumps(config)}} if config is not None else {}
        self._post(f"/v2/repository/models/{model}/load", body)

    def config(self, model: str) -> dict:
        """The configuration `model` is loaded with."""
        return json.loads(self._request(f"/v2/models/{model}/config", None))

    def unload(self, model: str) -> None:
        """Unload `model`; returns once Triton has started unloading it."""
        self._post(f"/v2/repository/models/{model}/unload")

    def _post(self, path: str, body: dict | None = None) -> bytes:
        return self._request(path, json.dumps(body or {}).encode())

    def _request(self, path: str, data: bytes | None) -> bytes:
        request = urllib.request.Request(
            self.base + path,
            data=data,
            method="GET" if data is None else "POST",
            headers={ADMIN_HEADER: self.key},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as reply:
                return reply.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            raise AdminRequestError(f"{path}: HTTP {exc.code} {detail}") from None

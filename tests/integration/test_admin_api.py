"""Triton's administrative APIs on the real server: refused without the admin key, served
with it, over HTTP and gRPC; inference, health and metadata stay open."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from specbatch.server.admin import ADMIN_HEADER, GRPC_ADMIN_HEADER, AdminRequestError, RepositoryClient

pytestmark = pytest.mark.integration


def post(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, data=b"{}", method="POST", headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.mark.parametrize(
    "path",
    [
        "/v2/repository/index",
        "/v2/repository/models/router/load",
        "/v2/repository/models/router/unload",
        "/v2/logging",
        "/v2/trace/setting",
        "/v2/systemsharedmemory/region/r/register",
    ],
)
@pytest.mark.parametrize("key", [None, "not-the-admin-key-at-all"])
def test_http_admin_apis_refuse_requests_without_the_key(server, path, key):
    headers = {ADMIN_HEADER: key} if key else {}
    status, body = post(f"http://{server.http_url}{path}", headers)
    assert status == 403, body
    assert f"expecting header '{ADMIN_HEADER}'" in body


def test_the_repository_api_serves_the_key_holder(server):
    repository = server.repository()
    states = {model["name"]: model["state"] for model in repository.index()}
    assert states == dict.fromkeys(("qwen3_specdec", "router", "scheduler", "specbatch"), "READY")
    # Past the restriction, model control itself answers.
    with pytest.raises(AdminRequestError, match=r"HTTP 500 .*failed to load .no_such_model."):
        repository.load("no_such_model")
    with pytest.raises(AdminRequestError, match="HTTP 403"):
        RepositoryClient(server.http_url, "x" * 32).index()


def test_grpc_admin_protocols_need_the_key(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        with pytest.raises(InferenceServerException, match="This protocol is restricted"):
            client.get_model_repository_index()
        with pytest.raises(InferenceServerException, match="This protocol is restricted"):
            client.update_log_settings({"log_verbose_level": 1})
        index = client.get_model_repository_index(
            headers={GRPC_ADMIN_HEADER: server.options.admin_key}, as_json=True
        )
        assert {model["name"] for model in index["models"]} >= {"specbatch", "scheduler"}
        assert client.is_server_ready() and client.is_model_ready("specbatch")
        assert client.get_model_metadata("specbatch").name == "specbatch"
    finally:
        client.close()


def test_inference_health_and_metadata_stay_open(server):
    with urllib.request.urlopen(f"http://{server.http_url}/v2/health/ready", timeout=10) as reply:
        assert reply.status == 200
    with urllib.request.urlopen(f"http://{server.http_url}/v2/models/specbatch/config", timeout=10) as reply:
        assert json.load(reply)["name"] == "specbatch"

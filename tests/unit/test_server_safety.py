"""Safe defaults in every shipped start command: loopback unless told otherwise, Triton's
administrative APIs behind the admin key, a non-root container, nothing evaluated as code."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from deploy_manifests import containers, flag, tritonserver_args

from specbatch import cli
from specbatch.openai.__main__ import build_parser
from specbatch.server.admin import (
    ADMIN_HEADER,
    ADMIN_KEY_ENV,
    RESTRICTED_APIS,
    AdminKeyError,
    admin_key,
    restriction_arguments,
)
from specbatch.server.ports import Ports
from specbatch.server.process import ServerOptions

ROOT = Path(__file__).resolve().parents[2]
KEY = "k" * 32
RESTRICTION = f"{','.join(RESTRICTED_APIS)}:{ADMIN_HEADER}="


def test_the_admin_key_comes_from_the_environment_or_is_random():
    assert admin_key({ADMIN_KEY_ENV: KEY}) == KEY
    generated = {admin_key({}) for _ in range(3)} | {admin_key({ADMIN_KEY_ENV: ""})}
    assert len(generated) == 4 and all(len(key) >= 32 for key in generated)
    for weak in ("short", "has:colon-and-is-long-enough", "has,comma-and-is-long-enough", "x" * 300):
        with pytest.raises(AdminKeyError, match=ADMIN_KEY_ENV):
            admin_key({ADMIN_KEY_ENV: weak})


def test_the_restriction_covers_repository_control_shared_memory_logging_and_trace():
    http, grpc = restriction_arguments(KEY)
    assert http == f"--http-restricted-api={RESTRICTION}{KEY}"
    assert grpc == f"--grpc-restricted-protocol={RESTRICTION}{KEY}"
    assert {"model-repository", "shared-memory", "logging", "trace"} <= set(RESTRICTED_APIS)
    assert not {"inference", "health", "metadata"} & set(RESTRICTED_APIS)
    with pytest.raises(AdminKeyError):
        restriction_arguments("a=b")


def test_server_options_bind_loopback_and_restrict_the_admin_apis(monkeypatch):
    monkeypatch.setenv(ADMIN_KEY_ENV, KEY)
    options = ServerOptions(root=ROOT, ports=Ports(1, 2, 3))
    args = options.arguments()
    for endpoint in ("http", "grpc", "metrics"):
        assert f"--{endpoint}-address=127.0.0.1" in args
    assert restriction_arguments(KEY) == [a for a in args if "restricted" in a]
    assert KEY not in repr(options)
    public = ServerOptions(root=ROOT, host="0.0.0.0", admin_key="z" * 20)
    # Triton's listeners stay on loopback: the gateway serves the public ports
    for endpoint in ("http", "grpc", "metrics"):
        assert f"--{endpoint}-address=127.0.0.1" in public.arguments()
    assert "--host=0.0.0.0" in public.gateway().command()
    public = public.arguments()
    assert f"--http-restricted-api={RESTRICTION}{'z' * 20}" in public


def test_specbatch_serve_and_the_openai_front_default_to_loopback(monkeypatch):
    seen = {}
    monkeypatch.setattr(cli, "serve", lambda *args, **kwargs: seen.update(args=args) or 0)
    assert cli.main(["serve"]) == 0
    assert seen["args"][2] == "127.0.0.1"
    cli.main(["serve", "--host", "0.0.0.0"])
    assert seen["args"][2] == "0.0.0.0"
    assert build_parser().parse_args([]).host == "127.0.0.1"


def test_the_container_serves_every_interface_as_a_non_root_user_with_the_restriction():
    dockerfile = (ROOT / "Dockerfile").read_text()
    [cmd] = re.findall(r"^CMD (\[.*\])$", dockerfile, re.MULTILINE)
    assert cmd == '["specbatch", "serve", "--host", "0.0.0.0", "--no-openai"]'
    users = re.findall(r"^USER (\S+)$", dockerfile, re.MULTILINE)
    assert users and users[-1] not in ("root", "0")
    assert dockerfile.index(f"USER {users[-1]}") < dockerfile.index("CMD [")


@pytest.mark.parametrize("variant", ["kubernetes", "kserve"])
def test_the_manifests_restrict_the_admin_apis_with_a_key_from_a_secret(variant):
    [triton] = [c for c in containers(variant) if tritonserver_args(c)]
    key = "$(SPECBATCH_ADMIN_KEY)"
    assert flag(tritonserver_args(triton), "http-restricted-api") == f"{RESTRICTION}{key}"
    assert flag(tritonserver_args(triton), "grpc-restricted-protocol") == f"{RESTRICTION}{key}"
    [env] = [e for e in triton["env"] if e["name"] == ADMIN_KEY_ENV]
    assert env["valueFrom"]["secretKeyRef"] == {"name": "specbatch-admin", "key": "key"}
    assert not env["valueFrom"]["secretKeyRef"].get("optional"), "a missing Secret must stop the pod"
    for container in containers(variant):
        if container["args"][:3] == ["python3", "-m", "specbatch.openai"]:
            assert "--host=0.0.0.0" in container["args"]


def test_readme_starts_tritonserver_only_through_the_launcher():
    """A bare `tritonserver` command in the README would leave the admin APIs open."""
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.DOTALL)
    for block in blocks:
        for line in block.splitlines():
            assert not re.match(r"\s*tritonserver\b", line), line


def test_no_request_data_is_evaluated_as_code():
    """eval/exec, pickle, marshal, yaml's object loaders and remote model code run code from
    their input; none of them may appear in what the server runs (YAML: safe_load only)."""
    found = subprocess.run(
        [
            "grep",
            "-rnE",
            "--include=*.py",
            r"(^|[^.A-Za-z0-9_])(eval|exec)\(|\b(import|from) (pickle|marshal|shelve|dill)\b"
            r"|yaml\.(unsafe_)?load\(|yaml\.(Unsafe|Full)?Loader|shell=True|trust_remote_code=True",
            "specbatch",
            "client",
            "model_repository",
            "loadtest",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert found.stdout == "", found.stdout

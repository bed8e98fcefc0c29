"""deploy/ against the running server: every metric the dashboard and the autoscaler read is
exported, every port and probe the manifests name is served, the server runs with their flags."""

from __future__ import annotations

import inspect
import socket
import subprocess
import sys
import urllib.parse
import urllib.request

import openai
import pytest
import tritonclient.grpc as grpcclient
from deploy_manifests import (
    VARIANTS,
    autoscaling_queries,
    containers,
    dashboard_queries,
    endpoint_picker_metrics,
    exported_names,
    flag,
    metric_names,
    one,
    tritonserver_args,
)
from helpers import GRAPH_PROMPT, INFOBENCH_PROMPT, MMLU_PROMPT, scrape

from specbatch.server.launcher import serve
from specbatch.server.ports import Ports

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def exposition(server, openai_front) -> str:
    """/metrics after traffic of every task, streamed and not (histograms appear per task)."""
    client = openai.OpenAI(base_url=f"{openai_front.url}/v1", api_key="unused", max_retries=0)
    client.completions.create(
        model="specbatch", prompt=[GRAPH_PROMPT, MMLU_PROMPT, INFOBENCH_PROMPT], max_tokens=8
    )
    list(client.completions.create(model="specbatch", prompt=INFOBENCH_PROMPT, max_tokens=8, stream=True))
    return scrape(server.metrics_url)


@pytest.mark.parametrize("source", ["dashboard", "autoscaling", "endpoint picker"])
def test_every_metric_queried_is_exported(exposition, source):
    if source == "endpoint picker":
        read = endpoint_picker_metrics()
    else:
        queries = dashboard_queries() if source == "dashboard" else autoscaling_queries()
        read = set().union(*(metric_names(q) for q in queries))
    assert read
    missing = read - exported_names(exposition)
    assert not missing, f"{source} reads metrics the server does not export: {sorted(missing)}"


def get(url: str) -> int:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return reply.status


def probe_passes(server, container: dict, probe: dict, urls: dict) -> bool:
    """One probe of the manifests run against the test server: an HTTP GET or a TCP connect
    to a port (``urls``: the manifest's port name or number -> base URL), or a command,
    its loopback Triton port replaced by the test server's."""
    if "exec" in probe:
        theirs = f"127.0.0.1:{flag(container['args'], 'http-port')}"
        ours = f"127.0.0.1:{server.options.triton_http_port}"
        command = [
            sys.executable if word == "python3" else word.replace(theirs, ours)
            for word in probe["exec"]["command"]
        ]
        return subprocess.run(command, timeout=30).returncode == 0
    if "tcpSocket" in probe:
        url = urllib.parse.urlsplit(urls[probe["tcpSocket"]["port"]])
        with socket.create_connection((url.hostname, url.port), timeout=10):
            return True
    check = probe["httpGet"]
    return get(urls[check["port"]] + check["path"]) == 200


def test_the_manifests_ports_are_the_servers_and_every_probe_answers(server, openai_front):
    """Named ports map to the endpoints `specbatch serve` opens by default; here on free ports."""
    defaults = Ports()
    openai_default = inspect.signature(serve).parameters["openai_port"].default
    served = {
        "http": (defaults.http, f"http://{server.http_url}"),
        "grpc": (defaults.grpc, None),
        "metrics": (defaults.metrics, f"http://127.0.0.1:{server.options.ports.metrics}"),
        "openai": (openai_default, openai_front.url),
    }
    pod = one("kubernetes", "Deployment")["spec"]["template"]["spec"]
    for container in pod["containers"]:
        for port in container.get("ports", []):
            assert port["containerPort"] == served[port["name"]][0], port
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            if probe in container:
                urls = {name: url for name, (_, url) in served.items() if url}
                assert probe_passes(server, container, container[probe], urls), (container["name"], probe)
    for endpoint in one("kubernetes", "ServiceMonitor")["spec"]["endpoints"]:
        assert get(served[endpoint["port"]][1] + endpoint["path"]) == 200
    client = grpcclient.InferenceServerClient(server.grpc_url)
    assert client.is_server_ready() and client.is_model_ready("specbatch")
    client.close()
    kserve_urls = {8080: f"http://{server.http_url}"}  # KServe's HTTP port, served by the gateway
    for container in containers("kserve"):
        for probe in ("livenessProbe", "readinessProbe"):
            if probe in container:
                passes = probe_passes(server, container, container[probe], kserve_urls)
                assert passes, (container["name"], probe)


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_manifests_run_tritonserver_with_the_flags_the_tests_run_it_with(server, variant):
    """Same flags and values, but ports, paths, timeouts and the admin key (the manifests
    take it from a Secret through $(SPECBATCH_ADMIN_KEY))."""
    [triton] = [args for c in containers(variant) if (args := tritonserver_args(c))]
    ours = dict(arg.split("=", 1) for arg in server.options.arguments() if "=" in arg)
    ours = {
        name: value.replace(server.options.admin_key, "$(SPECBATCH_ADMIN_KEY)")
        for name, value in ours.items()
    }
    for arg in triton[1:]:
        name, value = arg.split("=", 1)
        assert name in ours, arg
        if not name.endswith(("-port", "-repository", "exit-timeout-secs")):
            assert ours[name] == value, arg

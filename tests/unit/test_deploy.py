"""deploy/ validated offline: core objects against Kubernetes' own schemas, custom resources
(KEDA, Prometheus Operator, KServe) against their required structure, and the references
between objects (selectors, named ports, probes, scale targets, shutdown timing)."""

from __future__ import annotations

import kubernetes_validate
import pytest
import yaml
from deploy_manifests import (
    DEPLOY,
    VARIANTS,
    containers,
    dashboard,
    dashboard_queries,
    documents,
    flag,
    metric_names,
    one,
    tritonserver_args,
)

from specbatch.gateway.__main__ import build_parser as gateway_parser
from specbatch.openai.__main__ import build_parser

CORE_KINDS = {"Namespace", "Deployment", "Service"}
# apiVersion and the fields each custom resource cannot work without.
CUSTOM = {
    "ServiceMonitor": (
        "monitoring.coreos.com/v1",
        [("spec", "selector", "matchLabels"), ("spec", "endpoints")],
    ),
    "ScaledObject": ("keda.sh/v1alpha1", [("spec", "scaleTargetRef", "name"), ("spec", "triggers")]),
    "ServingRuntime": (
        "serving.kserve.io/v1alpha1",
        [("spec", "supportedModelFormats"), ("spec", "containers")],
    ),
    "InferenceService": (
        "serving.kserve.io/v1beta1",
        [("spec", "predictor", "model", "modelFormat", "name")],
    ),
}


def dig(doc: dict, path: tuple[str, ...]):
    for key in path:
        doc = doc[key]
    return doc


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_kustomization_lists_every_manifest(variant):
    files = {p.name for p in (DEPLOY / variant).glob("*.yaml")} - {"kustomization.yaml"}
    kustomization = yaml.safe_load((DEPLOY / variant / "kustomization.yaml").read_text())
    assert set(kustomization["resources"]) == files
    assert all(doc["apiVersion"] and doc["kind"] and doc["metadata"]["name"] for doc in documents(variant))


@pytest.mark.parametrize("variant", VARIANTS)
def test_core_objects_match_the_kubernetes_schema(variant):
    version = kubernetes_validate.utils.latest_version()
    core = [doc for doc in documents(variant) if doc["kind"] in CORE_KINDS]
    for doc in core:
        kubernetes_validate.validate(doc, version, strict=True)
    assert {doc["kind"] for doc in core} == (CORE_KINDS if variant == "kubernetes" else set())


def test_the_validator_rejects_a_broken_deployment():
    broken = one("kubernetes", "Deployment")
    broken["spec"]["template"]["spec"]["containers"][1]["ports"][0]["containerPort"] = "eight thousand"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, kubernetes_validate.utils.latest_version(), strict=True)


@pytest.mark.parametrize("variant", VARIANTS)
def test_custom_resources_have_their_required_structure(variant):
    custom = [doc for doc in documents(variant) if doc["kind"] not in CORE_KINDS]
    assert custom
    for doc in custom:
        api_version, paths = CUSTOM[doc["kind"]]
        assert doc["apiVersion"] == api_version, doc["kind"]
        for path in paths:
            assert dig(doc, path), (doc["kind"], path)


def test_the_service_and_monitor_reach_the_pods_named_ports():
    deployment, service = one("kubernetes", "Deployment"), one("kubernetes", "Service")
    pod = deployment["spec"]["template"]
    labels = pod["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert service["spec"]["selector"].items() <= labels.items()
    named = {p["name"]: p["containerPort"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
    assert named == {"http": 8000, "grpc": 8001, "metrics": 8002, "openai": 9000}
    assert {(p["port"], p["targetPort"]) for p in service["spec"]["ports"]} == {
        (number, name) for name, number in named.items()
    }
    monitor = one("kubernetes", "ServiceMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]
    for container in pod["spec"]["containers"]:
        ports = {p["name"] for p in container.get("ports", [])}
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            check = container.get(probe, {}).get("httpGet") or container.get(probe, {}).get("tcpSocket")
            if check:
                assert check["port"] in ports, (container["name"], probe)


def by_name(variant: str) -> dict[str, dict]:
    return {c["name"]: c for c in containers(variant)}


def test_the_openai_container_talks_to_the_servers_grpc_port():
    pod = by_name("kubernetes")
    triton, front = pod["tritonserver"], pod["openai"]
    assert front["args"][:3] == ["python3", "-m", "specbatch.openai"]
    options = build_parser().parse_args(front["args"][3:])
    assert options.grpc_url == f"localhost:{flag(triton['args'], 'grpc-port')}"
    assert options.port == 9000
    assert triton["resources"]["limits"]["nvidia.com/gpu"] == 2


@pytest.mark.parametrize(
    ("variant", "triton_name"), [("kubernetes", "tritonserver"), ("kserve", "kserve-container")]
)
def test_triton_s_listeners_stay_on_loopback_behind_the_gateway(variant, triton_name):
    """Triton 2.51 dies on large bodies and never answers what a dead scheduler held: only
    the gateway's ports reach the network, each forwarding to Triton's loopback listener,
    and Triton's own probes ask it there."""
    pod = by_name(variant)
    triton, gateway = pod[triton_name], pod["gateway"]
    args = tritonserver_args(triton)
    for listener in ("http", "grpc", "metrics"):
        assert flag(args, f"{listener}-address") == "127.0.0.1", listener
    assert gateway["args"][:3] == ["python3", "-m", "specbatch.gateway"]
    options = gateway_parser().parse_args(gateway["args"][3:])
    upstreams = {upstream for _, upstream in options.listen}
    assert upstreams == {
        f"http://127.0.0.1:{flag(args, 'http-port')}",
        f"http://127.0.0.1:{flag(args, 'metrics-port')}",
    }
    assert options.listen_grpc == [(8001, f"127.0.0.1:{flag(args, 'grpc-port')}")]
    declared = {p["containerPort"] for p in gateway["ports"]}
    # Knative lets one port be declared per pod: KServe's metrics and gRPC ports are not
    served = {port for port, _ in options.listen + options.listen_grpc}
    assert served == declared | ({8001, 8002} if variant == "kserve" else set())
    assert "ports" not in triton
    for probe in ("startupProbe", "livenessProbe"):
        if probe in triton:
            assert f"127.0.0.1:{flag(args, 'http-port')}/v2/health/" in triton[probe]["exec"]["command"][-1]


def test_the_gateway_supervises_the_pods_triton_with_the_admin_key():
    """Plain tritonserver does not restart a dead stub: the gateway does, seeing the stubs
    through the pod's shared process namespace and reloading through the repository API."""
    pod = one("kubernetes", "Deployment")["spec"]["template"]["spec"]
    assert pod["shareProcessNamespace"] is True
    gateway = by_name("kubernetes")["gateway"]
    assert gateway_parser().parse_args(gateway["args"][3:]).supervise
    [key] = [e for e in gateway["env"] if e["name"] == "SPECBATCH_ADMIN_KEY"]
    [triton_key] = [
        e for e in by_name("kubernetes")["tritonserver"]["env"] if e["name"] == "SPECBATCH_ADMIN_KEY"
    ]
    assert key == triton_key


def test_the_kserve_runtime_watches_triton_from_its_own_container():
    """No shared process namespace in a ServingRuntime: `specbatch watch` runs tritonserver,
    brings back dead stubs with the admin key Triton's restricted APIs take, and tells the
    gateway of a dead scheduler on the gateway's loopback control port."""
    pod = by_name("kserve")
    triton, gateway = pod["kserve-container"], pod["gateway"]
    assert triton["args"][:2] == ["specbatch", "watch"]
    watch_flags = triton["args"][2 : triton["args"].index("--")]
    control = gateway_parser().parse_args(gateway["args"][3:]).control_port
    assert watch_flags == [f"--notify=http://127.0.0.1:{control}/scheduler-lost"]
    assert "SPECBATCH_ADMIN_KEY" in {e["name"] for e in triton["env"]}
    assert "$(SPECBATCH_ADMIN_KEY)" in flag(tritonserver_args(triton), "http-restricted-api")


def test_the_kserve_runtimes_containers_are_valid_kubernetes_containers():
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "runtime"},
        "spec": {"containers": list(containers("kserve"))},
    }
    kubernetes_validate.validate(pod, kubernetes_validate.utils.latest_version(), strict=True)


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_grace_period_outlasts_the_servers_exit_timeout(variant):
    """The kubelet's SIGKILL must not cut short what tritonserver and the front drain on SIGTERM."""
    pod = list(containers(variant))
    [triton] = [args for c in pod if (args := tritonserver_args(c))]
    drains = [int(flag(triton, "exit-timeout-secs"))]
    drains += [float(flag(c["args"], "shutdown-timeout")) for c in pod if c["args"][0] == "python3"]
    if variant == "kubernetes":
        grace = one(variant, "Deployment")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    else:
        grace = one(variant, "InferenceService")["spec"]["predictor"]["terminationGracePeriodSeconds"]
    assert grace > max(drains)


@pytest.mark.parametrize("variant", VARIANTS)
def test_autoscaling_targets_the_deployment_on_the_queue(variant):
    scaled = one(variant, "ScaledObject")
    target = scaled["spec"]["scaleTargetRef"]
    if variant == "kubernetes":
        assert target["name"] == one(variant, "Deployment")["metadata"]["name"]
    else:
        isvc = one(variant, "InferenceService")
        assert target["name"] == f"{isvc['metadata']['name']}-predictor"
        assert isvc["metadata"]["annotations"]["serving.kserve.io/autoscalerClass"] == "external"
        assert (
            isvc["spec"]["predictor"]["model"]["runtime"]
            == one(variant, "ServingRuntime")["metadata"]["name"]
        )
    queries = [t["metadata"]["query"] for t in scaled["spec"]["triggers"] if t["type"] == "prometheus"]
    assert any("specbatch_queue_depth" in metric_names(q) for q in queries)
    assert scaled["spec"]["minReplicaCount"] >= 1


def test_the_dashboard_covers_what_a_user_watches():
    board = dashboard()
    assert board["uid"] == "specbatch" and board["templating"]["list"][0]["type"] == "datasource"
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    read = set().union(*(metric_names(e) for e in dashboard_queries()))
    for needed in (
        "nv_inference_request_success",
        "specbatch_goodput_prompts_total",
        "specbatch_sla_violations_total",
        "specbatch_ttft_seconds_bucket",
        "specbatch_tpot_seconds_bucket",
        "specbatch_e2e_seconds_bucket",
        "specbatch_queue_depth",
        "specbatch_running_rows",
        "specbatch_rows_allowed",
        "specbatch_accepted_draft_tokens_total",
        "specbatch_lookahead",
        "specbatch_lookahead_steps_total",
        "specbatch_lookahead_cut_for_kv_total",
        "specbatch_free_kv_blocks",
        "specbatch_prefix_hit_tokens_total",
        "specbatch_prefix_miss_tokens_total",
        "specbatch_instance_failures_total",
    ):
        assert needed in read, needed
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == "${datasource}"


def test_metric_names_are_read_out_of_promql():
    assert metric_names(
        'histogram_quantile(0.95, sum by (le, task) (rate(a_bucket{task="x"}[5m]))) / b or vector(0)'
    ) == {"a_bucket", "b"}
    assert metric_names("sum without (pod) (rate(c_total[$__rate_interval])) > 0") == {"c_total"}

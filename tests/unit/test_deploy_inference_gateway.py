"""deploy/inference-gateway: the specbatch pods as an InferencePool of the Gateway API
Inference Extension, its endpoint picker reading the pods' own queue and KV metrics, and
the route that sends OpenAI requests through it."""

from __future__ import annotations

import kubernetes_validate
import yaml
from deploy_manifests import (
    DEPLOY,
    containers,
    documents,
    endpoint_picker_args,
    endpoint_picker_metrics,
    flag,
    one,
)

from specbatch.gateway.__main__ import build_parser as gateway_parser

VARIANT = "inference-gateway"  # not one of VARIANTS: it runs no server of its own




def test_the_kustomization_lists_every_manifest_and_core_objects_are_valid():
    files = {p.name for p in (DEPLOY / VARIANT).glob("*.yaml")} - {"kustomization.yaml"}
    kustomization = yaml.safe_load((DEPLOY / VARIANT / "kustomization.yaml").read_text())
    assert set(kustomization["resources"]) == files
    version = kubernetes_validate.utils.latest_version()
    core = {"ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Deployment", "Service"}
    for doc in documents(VARIANT):
        if doc["kind"] in core:
            kubernetes_validate.validate(doc, version, strict=True)


def test_the_pool_is_the_specbatch_pods_on_their_openai_port():
    pool = one(VARIANT, "InferencePool")["spec"]
    pod_labels = one("kubernetes", "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert pool["selector"]["matchLabels"].items() <= pod_labels.items()
    [openai] = [c for c in containers("kubernetes") if c["name"] == "openai"]
    assert [p["number"] for p in pool["targetPorts"]] == [p["containerPort"] for p in openai["ports"]]


def test_the_picker_is_reached_where_the_pool_says_and_scrapes_the_gateways_metrics_port():
    pool = one(VARIANT, "InferencePool")
    picker = pool["spec"]["endpointPickerRef"]
    service = one(VARIANT, "Service")
    assert service["metadata"]["name"] == picker["name"]
    assert [p["port"] for p in service["spec"]["ports"]] == [picker["portNumber"]]
    args = endpoint_picker_args()
    assert flag(args, "grpc-port") == str(picker["portNumber"])
    assert flag(args, "pool-name") == pool["metadata"]["name"]
    [gateway] = [c for c in containers("kubernetes") if c["name"] == "gateway"]
    listeners = gateway_parser().parse_args(gateway["args"][3:]).listen
    metrics_port = next(port for port, upstream in listeners if upstream.endswith(":8012"))
    assert flag(args, "model-server-metrics-port") == str(metrics_port)
    assert flag(args, "lora-info-metric") == ""


def test_every_scheduling_plugin_is_declared_and_the_route_ends_at_the_pool():
    config = yaml.safe_load(one(VARIANT, "ConfigMap")["data"]["scoring.yaml"])
    declared = {plugin["type"] for plugin in config["plugins"]}
    used = {ref["pluginRef"] for profile in config["schedulingProfiles"] for ref in profile["plugins"]}
    assert used <= declared
    assert {"queue-scorer", "kv-cache-utilization-scorer", "prefix-cache-scorer"} <= used
    [deployment] = [d for d in documents(VARIANT) if d["kind"] == "Deployment"]
    volume = deployment["spec"]["template"]["spec"]["volumes"][0]["configMap"]["name"]
    assert volume == one(VARIANT, "ConfigMap")["metadata"]["name"]
    assert flag(endpoint_picker_args(), "config-file").endswith("/scoring.yaml")
    [rule] = one(VARIANT, "HTTPRoute")["spec"]["rules"]
    assert rule["backendRefs"] == [
        {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "specbatch"}
    ]
    gateway = one(VARIANT, "Gateway")
    assert one(VARIANT, "HTTPRoute")["spec"]["parentRefs"] == [{"name": gateway["metadata"]["name"]}]


def test_the_picker_reads_specbatch_metrics():
    assert endpoint_picker_metrics() == {"specbatch_queued_prompts", "specbatch_kv_cache_usage_perc"}

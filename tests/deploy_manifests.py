"""Reading deploy/: the Kubernetes and KServe manifests, the Grafana dashboard, and the
metric names their PromQL queries read (shared by the offline and the live tests)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import yaml

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
VARIANTS = ("kubernetes", "kserve")
_KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
}


def documents(variant: str) -> list[dict]:
    """Every manifest of a variant, in its kustomization's order."""
    kustomization = yaml.safe_load((DEPLOY / variant / "kustomization.yaml").read_text())
    docs = []
    for name in kustomization["resources"]:
        docs += [d for d in yaml.safe_load_all((DEPLOY / variant / name).read_text()) if d]
    return docs


def one(variant: str, kind: str) -> dict:
    [doc] = [d for d in documents(variant) if d["kind"] == kind]
    return doc


def dashboard() -> dict:
    return json.loads((DEPLOY / "grafana" / "specbatch.json").read_text())


def dashboard_queries() -> list[str]:
    return [t["expr"] for p in dashboard()["panels"] for t in p.get("targets", [])]


def autoscaling_queries() -> list[str]:
    return [
        trigger["metadata"]["query"]
        for variant in VARIANTS
        for trigger in one(variant, "ScaledObject")["spec"]["triggers"]
    ]


def endpoint_picker_args() -> list[str]:
    """The arguments of deploy/inference-gateway's endpoint picker."""
    [picker] = one("inference-gateway", "Deployment")["spec"]["template"]["spec"]["containers"]
    return picker["args"]


def endpoint_picker_metrics() -> set[str]:
    """The metric names the endpoint picker reads from every pod."""
    args = endpoint_picker_args()
    return {flag(args, "total-queued-requests-metric"), flag(args, "kv-cache-usage-percentage-metric")}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: identifiers that are not functions,
    keywords, label names or label values."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)  # strings
    expr = re.sub(r"\{[^}]*\}", " ", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", " ", expr)  # range selectors
    expr = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", expr):
        following = expr[match.end() :].lstrip()
        if match.group() not in _KEYWORDS and not following.startswith("("):
            names.add(match.group())
    return names


def exported_names(exposition: str) -> set[str]:
    """Sample names in a Prometheus text exposition (histograms give _bucket, _sum, _count)."""
    return {m.group(1) for m in re.finditer(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{| )", exposition, re.MULTILINE)}


def containers(variant: str) -> Iterator[dict]:
    if variant == "kubernetes":
        yield from one(variant, "Deployment")["spec"]["template"]["spec"]["containers"]
    else:
        yield from one(variant, "ServingRuntime")["spec"]["containers"]


def tritonserver_args(container: dict) -> list[str] | None:
    """The tritonserver command a container runs (from "tritonserver" on), directly or
    after `specbatch watch ... --`; None for a container that runs something else."""
    args = container["args"]
    if args[:2] == ["specbatch", "watch"]:
        args = args[args.index("--") + 1 :]
    return args if args[:1] == ["tritonserver"] else None


def flag(args: list[str], name: str) -> str | None:
    """The value of `--name=value` in a container's arguments."""
    for arg in args:
        if arg.startswith(f"--{name}="):
            return arg.split("=", 1)[1]
    return None

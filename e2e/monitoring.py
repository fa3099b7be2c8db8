"""What Prometheus and a CNI would do with the chart's monitoring objects, enough to check them without either:
the targets a PodMonitor or ServiceMonitor yields among Pods (Kubernetes service discovery's meta labels, then the
endpoint's relabelings, as the Prometheus Operator hands them over), whether NetworkPolicies admit a scraper to a
target, the series names of a scrape, and the metric names a PromQL query reads.

Only what the chart uses is modelled: the relabel actions keep, drop and replace; label selectors; TCP ports and
port ranges; namespace and Pod peers (no ipBlock)."""

import re
from dataclasses import dataclass
from typing import Any

import promql_parser
from prometheus_client.parser import text_string_to_metric_families

from api.selectors import LabelSelector

Obj = dict[str, Any]
META = "__meta_kubernetes_"
# Grafana's variables, as a query reaches Prometheus (the interval: any duration).
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m"}


@dataclass(frozen=True)
class Target:
    """One scrape: where, and the labels its series get from the target."""

    pod: str
    address: str  # host:port
    path: str
    labels: tuple[tuple[str, str], ...]

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])

    @property
    def url(self) -> str:
        return f"http://{self.address}{self.path}"

    def label(self, name: str) -> str | None:
        return dict(self.labels).get(name)


# ----- label selectors


def selects(selector: Obj | None, labels: dict[str, str]) -> bool:
    """Whether a label selector (API JSON) matches `labels`, as the API's own LabelSelector; an empty one matches
    all."""
    return LabelSelector.model_validate(selector or {}).matches(labels)


def _labels(obj: Obj) -> dict[str, str]:
    return obj["metadata"].get("labels") or {}


# ----- targets


def _sanitized(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def pod_meta_labels(pod: Obj, container: Obj, port: Obj | None) -> dict[str, str]:
    """Kubernetes service discovery's labels (role pod) of one container port (or a container with none)."""
    ip = pod["status"].get("podIP") or ""
    labels = {
        "__address__": ip if port is None else f"{ip}:{port['containerPort']}",
        f"{META}namespace": pod["metadata"]["namespace"],
        f"{META}pod_name": pod["metadata"]["name"],
        f"{META}pod_ip": ip,
        f"{META}pod_container_name": container["name"],
    }
    if port is not None:
        labels[f"{META}pod_container_port_number"] = str(port["containerPort"])
        labels[f"{META}pod_container_port_name"] = port.get("name", "")
    for kind, values in (("label", _labels(pod)), ("annotation", pod["metadata"].get("annotations") or {})):
        for key, value in values.items():
            labels[f"{META}pod_{kind}_{_sanitized(key)}"] = value
            labels[f"{META}pod_{kind}present_{_sanitized(key)}"] = "true"
    return labels


def relabel(labels: dict[str, str], configs: list[Obj]) -> dict[str, str] | None:
    """Prometheus's relabeling (keep, drop, replace) of one target; None: dropped."""
    labels = dict(labels)
    for config in configs:
        source = config.get("separator", ";").join(labels.get(name, "") for name in config.get("sourceLabels", []))
        match = re.fullmatch(config.get("regex", "(.*)"), source)
        action = config.get("action", "replace")
        if (action == "keep" and match is None) or (action == "drop" and match is not None):
            return None
        if action == "replace" and match is not None:
            replacement = re.sub(r"\$\{?(\d+)\}?", r"\\g<\1>", config.get("replacement", "$1"))
            value = match.expand(replacement)
            if value:
                labels[config["targetLabel"]] = value
            else:
                labels.pop(config["targetLabel"], None)
        elif action not in ("keep", "drop", "replace"):
            raise ValueError(f"relabel action {action!r} is not modelled")
    return labels


def _target(pod: Obj, endpoint: Obj, labels: dict[str, str] | None) -> Target | None:
    if labels is None:
        return None
    kept = {k: v for k, v in labels.items() if not k.startswith("__")}
    kept |= {"namespace": pod["metadata"]["namespace"], "pod": pod["metadata"]["name"]}
    return Target(pod["metadata"]["name"], labels["__address__"], endpoint.get("path", "/metrics"),
                  tuple(sorted(kept.items())))  # fmt: skip


def pod_monitor_targets(monitor: Obj, pods: list[Obj]) -> set[Target]:
    """The targets of a PodMonitor among `pods` (its own namespace's), deduplicated as Prometheus does."""
    found: set[Target] = set()
    spec = monitor["spec"]
    for pod in pods:
        if pod["metadata"]["namespace"] != monitor["metadata"]["namespace"] or not selects(
            spec["selector"], _labels(pod)
        ):
            continue
        if not pod["status"].get("podIP"):
            continue
        for endpoint in spec["podMetricsEndpoints"]:
            for container in pod["spec"]["containers"]:
                for port in container.get("ports") or [None]:
                    labels = relabel(pod_meta_labels(pod, container, port), endpoint.get("relabelings") or [])
                    target = _target(pod, endpoint, labels)
                    if target is not None:
                        found.add(target)
    return found


def service_monitor_targets(monitor: Obj, services: list[Obj], pods: list[Obj]) -> set[Target]:
    """The targets of a ServiceMonitor: the Pods behind each selected Service, at the named port's target port."""
    found: set[Target] = set()
    spec = monitor["spec"]
    for service in services:
        if not selects(spec["selector"], _labels(service)):
            continue
        ports = {p.get("name"): p for p in service["spec"]["ports"]}
        for endpoint in spec["endpoints"]:
            target_port = ports[endpoint["port"]].get("targetPort")
            for pod in pods:
                if not selects({"matchLabels": service["spec"]["selector"]}, _labels(pod)):
                    continue
                if not pod["status"].get("podIP") or pods_port(pod, target_port) is None:
                    continue
                labels = {"__address__": f"{pod['status']['podIP']}:{pods_port(pod, target_port)}"}
                target = _target(pod, endpoint, relabel(labels, endpoint.get("relabelings") or []))
                if target is not None:
                    found.add(target)
    return found


def pods_port(pod: Obj, port: int | str | None) -> int | None:
    """A port number, or the number of the Pod's container port of that name."""
    if isinstance(port, int):
        return port
    for container in pod["spec"]["containers"]:
        for declared in container.get("ports") or []:
            if declared.get("name") == port:
                return int(declared["containerPort"])
    return None


# ----- NetworkPolicies


@dataclass(frozen=True)
class Scraper:
    """The Pod that scrapes: its namespace, that namespace's labels, its own labels."""

    namespace: str
    namespace_labels: dict[str, str]
    labels: dict[str, str]


def admits(policies: list[Obj], pod: Obj, port: int, scraper: Scraper) -> bool:
    """Whether ingress from `scraper` to `pod`'s TCP `port` is allowed: no Ingress policy selects the Pod, or a
    rule of one that does admits the scraper to that port (policies add up)."""
    namespace = pod["metadata"]["namespace"]
    selecting = [
        p for p in policies
        if p["metadata"]["namespace"] == namespace and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])
        and selects(p["spec"]["podSelector"], _labels(pod))
    ]  # fmt: skip
    if not selecting:
        return True
    return any(
        _rule_admits(rule, pod, port, scraper, namespace) for p in selecting for rule in p["spec"].get("ingress") or []
    )


def _rule_admits(rule: Obj, pod: Obj, port: int, scraper: Scraper, namespace: str) -> bool:
    ports = rule.get("ports") or []
    if ports and not any(_port_matches(p, pod, port) for p in ports):
        return False
    peers = rule.get("from") or []
    return not peers or any(_peer_matches(peer, scraper, namespace) for peer in peers)


def _port_matches(entry: Obj, pod: Obj, port: int) -> bool:
    if entry.get("protocol", "TCP") != "TCP":
        return False
    if "port" not in entry:
        return True
    first = pods_port(pod, entry["port"])
    return first is not None and first <= port <= entry.get("endPort", first)


def _peer_matches(peer: Obj, scraper: Scraper, namespace: str) -> bool:
    if "ipBlock" in peer:
        return False  # not modelled: the chart names none
    if "namespaceSelector" in peer:
        in_namespace = selects(peer["namespaceSelector"], scraper.namespace_labels)
    else:
        in_namespace = scraper.namespace == namespace
    return in_namespace and selects(peer.get("podSelector"), scraper.labels)


# ----- scrapes and queries


def series_names(exposition: str) -> set[str]:
    """The names of the samples in a Prometheus text exposition (counters with `_total`, histograms' `_bucket`...)."""
    return {sample.name for family in text_string_to_metric_families(exposition) for sample in family.samples}


def metric_names(query: str) -> set[str]:
    """The metric names a PromQL query selects (Grafana's variables filled in first); a query that does not parse
    raises ValueError."""
    for variable, value in GRAFANA_VARIABLES.items():
        query = query.replace(variable, value)
    names: set[str] = set()

    def visit(node: Any) -> bool:
        if isinstance(node, promql_parser.VectorSelector) and node.name:
            names.add(node.name)
        return True

    promql_parser.walk(promql_parser.parse(query), visit)
    return names


def dashboard_queries(dashboard: Obj) -> dict[str, list[str]]:
    """Every panel's queries, by panel title."""
    return {panel["title"]: [target["expr"] for target in panel["targets"]] for panel in dashboard["panels"]}

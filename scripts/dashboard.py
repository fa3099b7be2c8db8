"""Write the Grafana dashboard of the chart (charts/dualpods/dashboards/dualpods.json) from its panel list.

Every query selects the dashboard's `namespace` and `release` variables: the namespace of the scraped Pods, and the
`dualpods_release` label the chart's ServiceMonitor and PodMonitors put on every series they scrape."""

import json
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parents[1] / "charts" / "dualpods" / "dashboards" / "dualpods.json"

RATE = "[$__rate_interval]"
SCOPE = 'namespace=~"$namespace", dualpods_release=~"$release"'
# Where the variables' values come from: every target of a release (Prometheus's own `up` series).
TARGETS = 'up{dualpods_release!=""}'
FAILED = 'status_code!~"2.."'  # an HTTP call that failed, or got no answer (0)
HOT = 'path="hot"'  # an actuation that woke a sleeper


def series(metric: str, matchers: str = "") -> str:
    """A selector of the metric in the dashboard's namespace and release, with more `matchers`."""
    return f"{metric}{{{SCOPE}{', ' + matchers if matchers else ''}}}"


def quantile(q: float, histogram: str, by: str = "") -> str:
    """PromQL for a quantile of a histogram, per `by` labels (comma-separated)."""
    labels = ", ".join(["le", *[b.strip() for b in by.split(",") if b.strip()]])
    return f"histogram_quantile({q}, sum by ({labels}) (rate({series(histogram + '_bucket')}{RATE})))"


# (title, unit, [(PromQL, legend)])
PANELS: list[tuple[str, str, list[tuple[str, str]]]] = [
    ("Actuation time p50 by path", "s", [(quantile(0.5, "fma_actuation_seconds", "path"), "{{path}}")]),
    ("Actuation time p99 by path", "s", [(quantile(0.99, "fma_actuation_seconds", "path"), "{{path}}")]),
    (
        "Actuations per minute by path",
        "short",
        [(f"sum by (path) (rate({series('fma_actuation_seconds_count')}{RATE})) * 60", "{{path}}")],
    ),
    (
        "Hot-start ratio: actuations that woke a sleeper",
        "percentunit",
        [
            (
                f"sum(rate({series('fma_actuation_seconds_count', HOT)}{RATE})) / "
                f"sum(rate({series('fma_actuation_seconds_count')}{RATE}))",
                "hot / all",
            )
        ],
    ),
    (
        "Placements per minute by result (sleeper-aware placement)",
        "short",
        [(f"sum by (result) (rate({series('dualpods_placements_total')}{RATE})) * 60", "{{result}}")],
    ),
    ("Bound requesters (GPUs in use)", "short", [(f"sum({series('fma_duality')})", "bound GPUs")]),
    (
        "Requesters Ready and not",
        "short",
        [
            (f"sum({series('dualpods_requester_ready')})", "Ready"),
            (f"count({series('dualpods_requester_ready')} == 0)", "not Ready"),
        ],
    ),
    (
        "Controller HTTP latency p99 by purpose",
        "s",
        [(quantile(0.99, "fma_http_latency_seconds", "purpose"), "{{purpose}}")],
    ),
    (
        "Controller HTTP failures by purpose",
        "reqps",
        [
            (
                f"sum by (purpose, status_code) (rate({series('fma_http_latency_seconds_count', FAILED)}{RATE}))",
                "{{purpose}} {{status_code}}",
            )
        ],
    ),
    (
        "Launcher Pods by phase",
        "short",
        [(f"sum by (lcfg_name, phase) ({series('fma_launcher_pod_count')})", "{{lcfg_name}} {{phase}}")],
    ),
    ("Launcher Pod creation p99", "s", [(quantile(0.99, "fma_launcher_create_seconds"), "create")]),
    (
        "Work queue depth and retries",
        "short",
        [
            (f"sum({series('fma_dpc_innerqueue_depth')})", "depth"),
            (f"sum(rate({series('fma_dpc_innerqueue_retries_total')}{RATE}))", "retries/s"),
        ],
    ),
    (
        "Instances by state (launchers)",
        "short",
        [(f"sum by (state) ({series('dualpods_launcher_instances')})", "{{state}}")],
    ),
    (
        "Wake and sleep time p99 (launchers)",
        "s",
        [
            (quantile(0.99, "dualpods_launcher_wake_seconds"), "wake"),
            (quantile(0.99, "dualpods_launcher_sleep_seconds"), "sleep"),
        ],
    ),
    ("Instance creation to ready p50", "s", [(quantile(0.5, "dualpods_launcher_instance_ready_seconds"), "ready")]),
    (
        "Serving instances: requests running and waiting",
        "short",
        [
            (f"sum by (instance_id) ({series('vllm:num_requests_running')})", "{{instance_id}} running"),
            (f"sum by (instance_id) ({series('vllm:num_requests_waiting')})", "{{instance_id}} waiting"),
        ],
    ),
]


def panel(index: int, title: str, unit: str, targets: list[tuple[str, str]]) -> dict[str, Any]:
    return {
        "id": index + 1,
        "type": "timeseries",
        "title": title,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": 8, "w": 12, "x": 12 * (index % 2), "y": 8 * (index // 2)},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "targets": [
            {"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend}
            for i, (expr, legend) in enumerate(targets)
        ],
    }


def variable(name: str, label: str, query: str) -> dict[str, Any]:
    """A multi-value query variable (all values by default) over the Prometheus data source."""
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "query": {"query": query, "refId": name},
        "refresh": 2,
        "multi": True,
        "includeAll": True,
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "sort": 1,
    }


def dashboard() -> dict[str, Any]:
    return {
        "title": "dualpods",
        "uid": "dualpods",
        "schemaVersion": 39,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "30s",
        "tags": ["dualpods", "fma", "llm"],
        "templating": {
            "list": [
                {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"},
                variable("namespace", "Namespace", f"label_values({TARGETS}, namespace)"),
                variable(
                    "release",
                    "Release",
                    'label_values(up{namespace=~"$namespace", dualpods_release!=""}, dualpods_release)',
                ),
            ]
        },
        "panels": [panel(i, *spec) for i, spec in enumerate(PANELS)],
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


if __name__ == "__main__":
    if sys.argv[1:] == ["--check"]:
        sys.exit(0 if OUT.read_text() == render() else "the dashboard is stale: run python scripts/dashboard.py")
    OUT.write_text(render())

"""Write the Grafana dashboard of the chart (charts/dualpods/dashboards/dualpods.json) from its panel list: the
panels two by two, then each row of ROWS (a titled row of its own panels) below them.

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
Panel = tuple[str, str, list[tuple[str, str]]]

PANELS: list[Panel] = [
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


def per_model(metric: str) -> str:
    """A warm pool's gauge per model. Only the leading dual-pods controller keeps a pool, but a replica that just
    lost the lead may still be scraped with its last values: the same number twice, so `max`, not `sum`."""
    return f"max by (model) ({series(metric)})"


# The warm pools: each model's copies asleep where a requester could wake one (status.pool.ready) against those its
# ISC declares (spec.warmPool.sleepers); a model short of its count for long is a pool that cannot be filled (its
# ISC's PoolReady condition and PoolUnfillable Event say why).
POOL_PANELS: list[Panel] = [
    (
        "Warm pool copies ready and declared by model",
        "short",
        [
            (per_model("dualpods_pool_sleepers"), "{{model}} ready"),
            (per_model("dualpods_pool_declared"), "{{model}} declared"),
        ],
    ),
    (
        "Warm pool copies missing by model (declared - ready)",
        "short",
        [
            (
                f"clamp_min({per_model('dualpods_pool_declared')} - {per_model('dualpods_pool_sleepers')}, 0)",
                "{{model}}",
            )
        ],
    ),
]

# (row title, its panels), below PANELS
ROWS: list[tuple[str, list[Panel]]] = [("Warm pools", POOL_PANELS)]


def panel(index: int, title: str, unit: str, targets: list[tuple[str, str]], x: int, y: int) -> dict[str, Any]:
    return {
        "id": index + 1,
        "type": "timeseries",
        "title": title,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": 8, "w": 12, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "targets": [
            {"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend}
            for i, (expr, legend) in enumerate(targets)
        ],
    }


def row(index: int, title: str, y: int) -> dict[str, Any]:
    """A row's title bar (expanded: its panels follow it in the list). `targets` is empty for the tools that read
    every panel's queries (e2e/monitoring.py)."""
    return {
        "id": index + 1,
        "type": "row",
        "title": title,
        "collapsed": False,
        "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
        "panels": [],
        "targets": [],
    }


def two_by_two(first: int, specs: list[Panel], top: int) -> tuple[list[dict[str, Any]], int]:
    """`specs` as panels two to a line from height `top`, their IDs from `first`; and the height below them."""
    made = [panel(first + i, *spec, x=12 * (i % 2), y=top + 8 * (i // 2)) for i, spec in enumerate(specs)]
    return made, top + 8 * ((len(specs) + 1) // 2)


def panels() -> list[dict[str, Any]]:
    found, y = two_by_two(0, PANELS, 0)
    for title, specs in ROWS:
        found.append(row(len(found), title, y))
        made, y = two_by_two(len(found), specs, y + 1)
        found.extend(made)
    return found


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
        "panels": panels(),
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


if __name__ == "__main__":
    if sys.argv[1:] == ["--check"]:
        sys.exit(0 if OUT.read_text() == render() else "the dashboard is stale: run python scripts/dashboard.py")
    OUT.write_text(render())

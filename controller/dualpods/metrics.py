"""FMA's dual-pods controller metrics (E10: same names and labels, so dashboards carry over), and ours.

A Pod's series go with it (`forget_pod`: a deleted requester's or provider's fma_duality, a requester's DRA
devices), so a cluster that
churns Pods does not grow the scrape without bound. The counts per InferenceServerConfig and LauncherConfig
stay at 0 once nothing is counted, as FMA's: there are as many as there are such objects.
"""

from collections import defaultdict
from enum import StrEnum

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from controller.http import Purpose
from kube.passclock import own_seconds_histogram

__all__ = ["BudgetAction", "DualPodsMetrics", "Purpose"]


class BudgetAction(StrEnum):
    """What a sleeper budget (E3) did: the `action` of dualpods_sleeper_budget_actions_total."""

    DELETED = "deleted"  # a sleeper, or an instance too big to keep asleep, deleted to stay within the budget
    WAKE_REFUSED = "wake_refused"  # its GPUs hold more than the budget and no sleeper of the launcher can go


ACTUATION_BUCKETS = (0, 1, 3, 5, 7.5, 10, 15, 30, 60, 120, 240, 480, 960, 1920)
HTTP_BUCKETS = (0.001, 0.01, 0.1, 1, 2, 3, 5, 10, 30, 90, 270, 810)
CREATE_BUCKETS = (0.001, 0.01, 0.1, 1, 2, 3, 4, 5)
QUEUE_BUCKETS = tuple(4**k / 64 for k in range(7))


PodKey = tuple[str, str]  # (namespace, Pod name)
Series = tuple[Gauge, tuple[str, ...], tuple[PodKey, ...]]  # a gauge, its label values, the Pods they name


class DualPodsMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        # The series that name each Pod, so that forget_pod removes exactly those: prometheus_client's
        # remove_by_labels reads every series of the gauge, thousands for each Pod a swap wave deletes.
        self._series_of: defaultdict[PodKey, set[Series]] = defaultdict(set)
        self.actuation_seconds = Histogram(
            "fma_actuation_seconds",
            "Requester container start to the reply to its first successful become-ready.",
            ["exported_namespace", "path", "instancesDeleted", "isc_name"],
            buckets=ACTUATION_BUCKETS,
            registry=registry,
        )
        self.http_latency_seconds = Histogram(
            "fma_http_latency_seconds",
            "Latency of the controller's HTTP calls to requesters, launchers and model servers.",
            ["purpose", "method", "exported_namespace", "isc_name", "status_code"],
            buckets=HTTP_BUCKETS,
            registry=registry,
        )
        self.launcher_create_seconds = Histogram(
            "fma_launcher_create_seconds",
            "API Create latency of launcher Pods the controller creates.",
            ["exported_namespace", "lcfg_name", "success"],
            buckets=CREATE_BUCKETS,
            registry=registry,
        )
        self.duality = Gauge(
            "fma_duality",
            "1 while a requester is bound to a launcher instance, per GPU; 0 after.",
            [
                "exported_namespace",
                "requester_name",
                "exported_pod",
                "exported_container",
                "instance_id",
                "UUID",
                "node",
            ],
            registry=registry,
        )
        self.requester_devices = Gauge(
            "dualpods_requester_device_info",
            "1 for each DRA device a requester's GPUs come from (requesters with ResourceClaims), from its first "
            "bind until it is deleted; join on UUID with fma_duality for the instance that runs on it.",
            ["exported_namespace", "requester_name", "UUID", "driver", "pool", "device"],
            registry=registry,
        )
        self.requester_count = Gauge(
            "fma_requester_count", "Requesters carrying each InferenceServerConfig.", ["isc_name"], registry=registry
        )
        self.isc_count = Gauge(
            "fma_isc_count", "InferenceServerConfigs per LauncherConfig.", ["launcher_config_name"], registry=registry
        )
        self.queue_adds = Counter("fma_dpc_innerqueue_adds", "Adds to the work queue.", ["node"], registry=registry)
        self.queue_depth = Gauge("fma_dpc_innerqueue_depth", "Work queue length.", ["node"], registry=registry)
        self.queue_retries = Counter(
            "fma_dpc_innerqueue_retries", "Retries of failed work items.", ["node"], registry=registry
        )
        self.queue_wait_seconds = Histogram(
            "fma_dpc_innerqueue_queue_duration_seconds",
            "Time from a work item's unique add to the queue to its dequeue.",
            ["node"],
            buckets=QUEUE_BUCKETS,
            registry=registry,
        )
        self.queue_work_seconds = Histogram(
            "fma_dpc_innerqueue_work_duration_seconds",
            "Time to process one work item.",
            ["node"],
            buckets=QUEUE_BUCKETS,
            registry=registry,
        )
        self.reconcile_own_seconds = own_seconds_histogram(registry)
        self.passes = Counter(
            "dualpods_passes",
            "Reconcile passes of requesters, by the phase they ran and how its step ended (done, wait, problem, "
            "error).",
            ["phase", "result"],
            registry=registry,
        )
        self.wake_check_failures = Counter(
            "dualpods_wake_check_failures",
            "Instances a launcher killed for failing their post-wake check, replaced for their requester.",
            ["exported_namespace", "isc_name"],
            registry=registry,
        )
        self.sleeper_budget_actions = Counter(
            "dualpods_sleeper_budget_actions",
            "What the sleeper budgets did: deleted (a sleeper, or an instance too big to keep asleep), "
            "wake_refused (its GPUs over the budget and no sleeper could go).",
            ["exported_namespace", "isc_name", "action"],
            registry=registry,
        )
        self.placements = Counter(
            "dualpods_placements",
            "Requesters that opted in to sleeper-aware placement, by result: PlacedOnSleeper (preferred onto a free "
            "GPU holding a sleeper of its model), NoSleeper (none free where it may run), PlacementInvalid.",
            ["exported_namespace", "result"],
            registry=registry,
        )
        self.pool_sleepers = Gauge(
            "dualpods_pool_sleepers",
            "Copies of a model's warm pool asleep where a requester could wake one now (its ISC's status.pool.ready).",
            ["exported_namespace", "model"],
            registry=registry,
        )
        self.pool_declared = Gauge(
            "dualpods_pool_declared",
            "Sleeping copies a model's warm pool declares (its ISC's spec.warmPool.sleepers).",
            ["exported_namespace", "model"],
            registry=registry,
        )

    def set_duality(
        self, value: float, namespace: str, requester: str, provider: str, container: str, instance: str, gpu: str,
        node: str,
    ) -> None:  # fmt: skip
        labels = (namespace, requester, provider, container, instance, gpu, node)
        self._set(self.duality, labels, ((namespace, requester), (namespace, provider)), value)

    def set_requester_device(
        self, namespace: str, requester: str, gpu: str, driver: str, pool: str, device: str
    ) -> None:
        labels = (namespace, requester, gpu, driver, pool, device)
        self._set(self.requester_devices, labels, ((namespace, requester),), 1)

    def _set(self, gauge: Gauge, labels: tuple[str, ...], named: tuple[PodKey, ...], value: float) -> None:
        gauge.labels(*labels).set(value)
        for key in named:
            self._series_of[key].add((gauge, labels, named))

    def forget_pool(self, namespace: str, model: str) -> None:
        """The model declares no pool any more (or is gone): its pool series go."""
        for gauge in (self.pool_sleepers, self.pool_declared):
            gauge.remove(namespace, model)

    def forget_pod(self, namespace: str, name: str) -> None:
        """The Pod is gone: drop the series that name it (fma_duality as requester or as provider, its devices)."""
        for gauge, labels, named in self._series_of.pop((namespace, name), set()):
            gauge.remove(*labels)
            for other in named:
                if other != (namespace, name) and (series := self._series_of.get(other)) is not None:
                    series.discard((gauge, labels, named))
                    if not series:
                        del self._series_of[other]

"""What is hot where: the launchers' instance summaries (api/launcher_summary.py) arranged per node and GPU,
and per model, for `kubectl dualpods status` (controller/kubectl_plugin.py). Pure: Pods, the gpu-map
ConfigMap and the InferenceServerConfigs in, a FleetStatus out, and its two renderings (a table, JSON).

A node's GPUs are those the gpu-map ConfigMap lists for it and those its launchers' instances use; a GPU
none of whose instances serves or loads is free (its sleepers can be woken there, or evicted).

A model with a warm pool (its ISC's `spec.warmPool`) has its pool shown as its ISC's status says (`status.pool`,
the `PoolReady` condition), and each sleeper that is a copy of its pool is marked: a sleeping instance of the
ISC's current version (the ID its requesters would ask for on those GPUs), which is what the pool keeper counts.
"""

import json
from collections import defaultdict
from collections.abc import Callable, Sequence
from datetime import datetime

from pydantic import BaseModel, Field, ValidationError

from api import keys, launcher_summary
from api.crds import POOL_READY, InferenceServerConfig
from api.launcher_summary import InstanceSummary, SummaryState
from controller import pods
from controller.dualpods.gpu_map import gpu_locations
from controller.dualpods.identity import instance_id, runtime_of
from controller.dualpods.placement.choice import decided
from kube.informer import Obj

NO_GPU = "-"  # the row of an instance that uses no GPU (a CPU launcher)
BUSY = (SummaryState.SERVING, SummaryState.LOADING)
POOL_MARK = " (pool)"  # after the state of a sleeper that is a copy of its model's warm pool


class Placed(BaseModel):
    """An instance where it runs; `pool` when it is a sleeping copy of its model's warm pool."""

    namespace: str
    launcher: str
    node: str
    instance: InstanceSummary
    pool: bool | None = None  # left out of the JSON unless True


class GpuStatus(BaseModel):
    uuid: str
    index: int | None = None  # its index on the node, where the gpu-map says
    free: bool
    instances: list[Placed] = Field(default_factory=list)


class NodeStatus(BaseModel):
    name: str
    gpus: list[GpuStatus] = Field(default_factory=list)
    launchers_unsummarized: list[str] = Field(default_factory=list)  # not reached by the controller yet
    instances_omitted: int = 0  # beyond the summaries' bound


class ModelStatus(BaseModel):
    model: str
    serving: list[Placed] = Field(default_factory=list)
    loading: list[Placed] = Field(default_factory=list)
    asleep: list[Placed] = Field(default_factory=list)


class PlacementStatus(BaseModel):
    """Sleeper-aware placement over the requesters there are now: of those that opted in (their placement decided),
    how many were preferred onto a sleeper of their model, and how many are served by that very sleeper (hot)."""

    decided: int = 0
    on_sleeper: int = 0
    hot: int = 0


class WarmPoolStatus(BaseModel):
    """A model's warm pool as its ISC's status shows it (`ready` and the rest None until the controller wrote it)."""

    namespace: str
    isc: str
    model: str
    declared: int
    ready: int | None = None
    loading: int | None = None
    nodes: int | None = None
    reason: str | None = None  # of the PoolReady condition: Filled, Filling, NoLauncher, NoIdleGPU, SleeperBudget
    message: str | None = None


class FleetStatus(BaseModel):
    nodes: list[NodeStatus]
    models: list[ModelStatus]
    placement: PlacementStatus = Field(default_factory=PlacementStatus)
    pools: list[WarmPoolStatus] = Field(default_factory=list)


def placement_status(requesters: list[Obj], launchers: list[Obj]) -> PlacementStatus:
    serving = {
        (binding.requester_uid, pods.name(pod)): pods.annotations(pod).get(keys.INSTANCE_ID_ANNOTATION)
        for pod in launchers
        if (binding := pods.binding(pod)) is not None
    }
    status = PlacementStatus()
    for requester in requesters:
        decision = decided(requester)
        if decision is None:
            continue
        status.decided += 1
        if (spot := decision.spot) is not None:
            status.on_sleeper += 1
            status.hot += serving.get((pods.uid(requester), spot.launcher)) == spot.instance
    return status


def pooled(iscs: list[Obj]) -> list[InferenceServerConfig]:
    """The ISCs that declare a warm pool of at least one copy (one that does not parse is left out: its own status
    says what is wrong with it)."""
    found = []
    for obj in iscs:
        if not ((obj.get("spec") or {}).get("warmPool") or {}).get("sleepers"):
            continue
        try:
            found.append(InferenceServerConfig.from_k8s(obj))
        except ValidationError:
            continue
    return found


def pool_status(isc: InferenceServerConfig) -> WarmPoolStatus:
    assert isc.spec.warm_pool is not None
    shown, condition = isc.status.pool, isc.status.condition(POOL_READY)
    return WarmPoolStatus(
        namespace=isc.metadata.namespace or "",
        isc=isc.metadata.name,
        model=launcher_summary.model_name(isc.spec.model_server_config.options),
        declared=shown.declared if shown is not None else isc.spec.warm_pool.sleepers,
        ready=shown.ready if shown is not None else None,
        loading=shown.loading if shown is not None else None,
        nodes=shown.nodes if shown is not None else None,
        reason=condition.reason if condition is not None else None,
        message=condition.message if condition is not None else None,
    )


def _copy_test(iscs: list[InferenceServerConfig]) -> Callable[[Placed], bool]:
    """Whether a placed instance is a copy of a warm pool: asleep, of a pooled ISC, with the ID of its current
    version on those GPUs (a sleeper left from an older version of the ISC is none)."""
    by_name = {(isc.metadata.namespace or "", isc.metadata.name): isc for isc in iscs}

    def runtime(isc: InferenceServerConfig) -> str | None:
        try:
            return runtime_of({}, isc.metadata.annotations)
        except ValueError:
            return None  # an unknown runtime: the ISC's status says so, and it has no copies

    def is_copy(where: Placed) -> bool:
        instance = where.instance
        isc = by_name.get((where.namespace, instance.isc or ""))
        if isc is None or instance.state is not SummaryState.ASLEEP or (chosen := runtime(isc)) is None:
            return False
        return instance.id == instance_id(isc, list(instance.gpus), chosen)

    return is_copy


def fleet_status(
    launchers: list[Obj], gpu_maps: list[Obj], requesters: list[Obj] | None = None, iscs: list[Obj] | None = None
) -> FleetStatus:
    """The fleet from launcher Pods (with their summaries), gpu-map ConfigMaps, requester Pods and
    InferenceServerConfigs (any namespaces)."""
    pools = pooled(iscs or [])
    is_copy = _copy_test(pools)
    indices: dict[str, dict[str, int]] = defaultdict(dict)  # node -> UUID -> index
    for configmap in gpu_maps:
        for uuid, location in gpu_locations(configmap).items():
            indices[location.node][uuid] = location.index
    placed: dict[str, list[Placed]] = defaultdict(list)  # node -> instances
    nodes: dict[str, NodeStatus] = {node: NodeStatus(name=node) for node in indices}
    for pod in launchers:
        node = pods.node_name(pod) or "(unscheduled)"
        status = nodes.setdefault(node, NodeStatus(name=node))
        summary = launcher_summary.parse(pods.annotations(pod).get(launcher_summary.ANNOTATION))
        if summary is None:
            status.launchers_unsummarized.append(pods.name(pod))
            continue
        status.instances_omitted += summary.omitted
        for instance in summary.instances:
            where = Placed(namespace=pods.namespace(pod), launcher=pods.name(pod), node=node, instance=instance)
            if is_copy(where):
                where.pool = True
            placed[node].append(where)
    for node, status in nodes.items():
        by_gpu: dict[str, list[Placed]] = {uuid: [] for uuid in indices[node]}
        for where in placed[node]:
            for uuid in where.instance.gpus or [NO_GPU]:
                by_gpu.setdefault(uuid, []).append(where)
        status.gpus = [
            GpuStatus(
                uuid=uuid,
                index=indices[node].get(uuid),
                free=not any(w.instance.state in BUSY for w in found),
                instances=sorted(found, key=lambda w: (list(SummaryState).index(w.instance.state), w.instance.model)),
            )
            for uuid, found in sorted(by_gpu.items(), key=lambda item: (indices[node].get(item[0], 1 << 30), item[0]))
        ]
    return FleetStatus(
        nodes=sorted(nodes.values(), key=lambda n: n.name),
        models=_models(placed),
        placement=placement_status(requesters or [], launchers),
        pools=sorted((pool_status(isc) for isc in pools), key=lambda p: (p.namespace, p.isc)),
    )


def _models(placed: dict[str, list[Placed]]) -> list[ModelStatus]:
    models: dict[str, ModelStatus] = {}
    for where in (w for found in placed.values() for w in found):
        model = models.setdefault(where.instance.model, ModelStatus(model=where.instance.model))
        column = {SummaryState.SERVING: model.serving, SummaryState.LOADING: model.loading,
                  SummaryState.ASLEEP: model.asleep}.get(where.instance.state)  # fmt: skip
        if column is not None:
            column.append(where)
    return sorted(models.values(), key=lambda m: m.model)


def as_json(fleet: FleetStatus) -> str:
    return json.dumps(fleet.model_dump(mode="json", by_alias=True, exclude_none=True), indent=2)


def as_table(fleet: FleetStatus, now: datetime) -> str:
    """Two tables: per node and GPU what runs there, then per model where it serves and sleeps; a third of the warm
    pools where a model declares one. A sleeper that is a copy of its model's pool is marked `(pool)`."""
    rows = [("NODE", "GPU", "STATE", "MODEL", "LAUNCHER", "SINCE", "INSTANCE")]
    notes = []
    for node in fleet.nodes:
        for gpu in node.gpus:
            name = gpu.uuid if gpu.index is None else f"{gpu.index}:{gpu.uuid}"
            if not gpu.instances:
                rows.append((node.name, name, "free", "", "", "", ""))
            for where in gpu.instances:
                instance = where.instance
                since = _age(now, instance.since)
                state = instance.state.value + (POOL_MARK if where.pool else "")
                rows.append((node.name, name, state, instance.model, where.launcher, since, instance.id))
        if node.launchers_unsummarized:
            notes.append(f"{node.name}: no summary yet on {', '.join(node.launchers_unsummarized)}")
        if node.instances_omitted:
            notes.append(f"{node.name}: {node.instances_omitted} more instances not summarized")
    models = [("MODEL", "SERVING", "LOADING", "ASLEEP")]
    for model in fleet.models:
        models.append((model.model, _where(model.serving), _where(model.loading), _where(model.asleep)))
    return "\n".join(
        [_columns(rows), *notes, "", _columns(models), *_pools_table(fleet.pools), *_placement_line(fleet.placement)]
    )


def _pools_table(pools: list[WarmPoolStatus]) -> list[str]:
    """Per ISC with a warm pool: its copies ready of those declared, loading, the Nodes they are on, and why it is
    not full (its PoolReady condition); `-` where the controller has not written its status yet."""
    if not pools:
        return []
    rows = [("POOL", "MODEL", "READY", "LOADING", "NODES", "REASON", "MESSAGE")]
    for pool in pools:
        ready = "-" if pool.ready is None else str(pool.ready)
        rows.append((pool.isc, pool.model, f"{ready}/{pool.declared}", _count(pool.loading), _count(pool.nodes),
                     pool.reason or "-", pool.message or ""))  # fmt: skip
    return ["", _columns(rows)]


def _count(value: int | None) -> str:
    return "-" if value is None else str(value)


def _placement_line(placement: PlacementStatus) -> list[str]:
    if not placement.decided:
        return []
    return [
        "",
        f"placement: {placement.decided} requesters opted in; {placement.on_sleeper} placed on a sleeper of their "
        f"model, {placement.hot} of them served by it (hot): hit ratio {100 * placement.hot / placement.decided:.0f}%",
    ]


def _where(placed: list[Placed]) -> str:
    return ", ".join(_spot(w) for w in placed) or "-"


def _spot(w: Placed) -> str:
    return f"{w.node}/{w.launcher}[{','.join(w.instance.gpus) or NO_GPU}]{POOL_MARK if w.pool else ''}"


def _age(now: datetime, since: datetime) -> str:
    seconds = max(0, int((now - since).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _columns(rows: Sequence[tuple[str, ...]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows
    )

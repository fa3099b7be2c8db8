"""Keeps each launcher Pod's instance summary (api/launcher_summary.py) in line with the launcher's view.

A loop of its own beside the requesters' reconciler: a summary says what a launcher holds, whoever its
instances serve, so it is keyed by launcher and driven by the launchers' views (each change and each list
of a launcher) and by the launcher Pods (a new one, or a summary someone else edited). It writes only
when the summary differs from the annotation, so a launcher whose instances do not change is not written,
and SETTLE_S after the change that asked for it: a change of an instance comes with the reconciler's own
writes to the same Pod (binding, routing labels), which a summary written at that moment would make fail
their optimistic concurrency check and retry. The reconciler's "instance serving" write carries the
summary of that moment too (serving.py), so an actuation's summary is mostly found written already.
Only a synced view is summarized: a launcher that is not reachable keeps its last summary (what it held
when last seen), and a launcher Pod that goes takes its summary with it.
"""

from collections.abc import Callable
from datetime import UTC, datetime

from api import launcher_summary
from controller import pods
from controller.dualpods.collaborators import PodWrites
from controller.dualpods.writer import set_annotation
from controller.informer import Informer, Obj
from controller.launcher_views import LauncherView, ViewSource
from controller.workqueue import WorkQueue, run_workers

SETTLE_S = 1.0


def summary_text(launcher: pods.Pod, view: LauncherView, now: datetime) -> str:
    """The summary annotation the launcher Pod should carry for its view (each unchanged state keeping the
    `since` its current annotation gives it)."""
    written = launcher_summary.of_pod(launcher)
    return launcher_summary.summarize(view.instances.values(), written, now).annotation()


class LauncherSummaries:
    def __init__(
        self,
        namespace: str,
        pod_cache: Informer,
        views: ViewSource,
        writer: PodWrites,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.namespace = namespace
        self._pods = pod_cache
        self._views = views
        self._writer = writer
        self._now = now
        self.settle_s = SETTLE_S
        self.queue: WorkQueue[str] = WorkQueue("launcher-summaries")
        views.subscribe(self._changed, self._listed)
        pod_cache.subscribe(self._pod_changed)

    async def run(self) -> None:
        """Process changed launchers until the queue shuts down (once the caches have synced)."""
        await run_workers(self.queue, self.reconcile, workers=1)

    async def reconcile(self, launcher: str) -> float | None:
        pod = self._pods.get(f"{self.namespace}/{launcher}")
        view = self._views.get(launcher)
        if pod is None or pods.is_deleting(pod) or not pods.is_launcher(pod) or view is None or not view.synced:
            return None
        text = summary_text(pod, view, self._now())
        if text != launcher_summary.annotation_on(pod):
            await self._writer.update(pod, lambda p: set_annotation(p, launcher_summary.ANNOTATION, text), "summary")
        return None

    def _changed(self, launcher: str) -> None:
        self.queue.add_after(launcher, self.settle_s)

    def _listed(self, launcher: str, view: LauncherView) -> None:
        self._changed(launcher)

    def _pod_changed(self, old: Obj | None, new: Obj | None) -> None:
        if new is not None and pods.is_launcher(new):
            self._changed(pods.name(new))

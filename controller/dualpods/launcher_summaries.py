"""A launcher Pod's instance summary (api/launcher_summary.py) as the controller computes it from its view.

A summary says what a launcher holds, whoever its instances serve. It is written by the loop keyed by
launcher (drains.py), together with the launcher's warm label in one write, and only when it differs from
the annotation, so a launcher whose instances do not change is not written. That loop looks at a launcher
SETTLE_S after the change that asked for it: a change of an instance comes with the reconciler's own writes
to the same Pod (binding, routing labels), which a summary written at that moment would make fail their
optimistic concurrency check and retry. The reconciler's "instance serving" write carries the summary of
that moment too (serving.py), so an actuation's summary is mostly found written already. Only a synced
view is summarized: a launcher that is not reachable keeps its last summary (what it held when last seen),
and a launcher Pod that goes takes its summary with it.
"""

from datetime import datetime

from api import launcher_summary
from controller import pods
from controller.launcher_views import LauncherView

SETTLE_S = 1.0


def summary_text(launcher: pods.Pod, view: LauncherView, now: datetime) -> str:
    """The summary annotation the launcher Pod should carry for its view (each unchanged state keeping the
    `since` its current annotation gives it)."""
    written = launcher_summary.of_pod(launcher)
    return launcher_summary.summarize(view.instances.values(), written, now).annotation()

"""Stuck launchers are reported, never replaced: a replacement would likely get stuck the same way,
and the stuck one is worth investigating. On entering a stuck phase a launcher gets the label
`dual-pods.llm-d.ai/launcher-stuck="true"` and one Warning Event `LauncherStuck`; the label is what
makes the Event one-off, and it is removed once the launcher is no longer stuck.
"""

from collections.abc import Iterable

from api import keys
from controller import pods
from controller.launcher_template import Pod
from controller.populator.kubeapi import LauncherApi
from controller.populator.phases import STUCK, LauncherPodPhase

REASON = "LauncherStuck"


def message(phase: LauncherPodPhase) -> str:
    return f"Launcher is stuck ({phase}); leaving it in place for investigation"


async def report_stuck(api: LauncherApi, launchers: Iterable[tuple[Pod, LauncherPodPhase]]) -> None:
    """Bring each kept launcher's label (and Event) in line with its phase; API errors other than
    NotFound propagate, so the key is retried."""
    for pod, phase in launchers:
        labels = pods.labels(pod)
        if phase in STUCK:
            if labels.get(keys.LAUNCHER_STUCK_LABEL) != "true" and await api.set_stuck_label(pod, True):
                await api.warn(pod, REASON, message(phase))
        elif keys.LAUNCHER_STUCK_LABEL in labels:
            await api.set_stuck_label(pod, False)

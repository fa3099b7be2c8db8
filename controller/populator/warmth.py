"""What deleting an unbound launcher would throw away: its sleeping instances (E13, warm state is
precious). The populator removes surplus launchers in order of least loss: no sleepers first, then the
fewest sleeper bytes and sleepers, then the least recently used (the dual-pods controller's last write to
the Pod), then a launcher that is not Ready, then the newest."""

from dataclasses import dataclass

from api.launcher import InstanceStatus
from controller import pods
from controller.launcher_template import Pod
from controller.launcher_views import LauncherView


@dataclass(frozen=True)
class Warmth:
    """A launcher's sleeping instances, as its view reports them (none while its instances are unknown)."""

    sleepers: int = 0
    sleeper_bytes: int = 0

    @classmethod
    def of(cls, view: LauncherView | None) -> "Warmth":
        if view is None or not view.synced:
            return cls()
        asleep = [s for s in view.instances.values() if s.sleeping and s.status is InstanceStatus.RUNNING]
        return cls(len(asleep), sum(s.process.rss_bytes for s in asleep if s.process is not None))

    def __str__(self) -> str:
        return f"{self.sleepers} sleeping instance(s), {self.sleeper_bytes} bytes"


def loss(pod: Pod, warmth: Warmth) -> tuple[bool, int, int, str, bool, float]:
    """Sort key: the lower, the less deleting `pod` costs."""
    created = pods.timestamp(pods.meta(pod).get("creationTimestamp")) or 0.0
    return (
        warmth.sleepers > 0,
        warmth.sleeper_bytes,
        warmth.sleepers,
        pods.last_used(pod) if warmth.sleepers else "",  # how recently its sleepers were used
        pods.is_ready(pod),
        -created,
    )

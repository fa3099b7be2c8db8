"""Each placed requester told where it was placed and why: one Event on the requester Pod, with the decision's
reason (PlacedOnSleeper, NoSleeper, PlacementInvalid as a Warning). The admission cannot say it itself: the Pod
has no name yet then. A requester is told once, when the controller first sees it within ANNOUNCE_WITHIN_S of
its creation (a restarted controller does not repeat what its predecessor said).
"""

import time

from controller import pods
from controller.dualpods.placement.choice import Result, decided
from kube import events
from kube.events import EventSink, EventType
from kube.informer import Informer

ANNOUNCE_WITHIN_S = 60.0


class PlacementAnnouncer:
    def __init__(self, namespace: str, pods_cache: Informer, events: EventSink) -> None:
        self.namespace = namespace
        self.pods = pods_cache
        self.events = events
        self.told: set[str] = set()  # requester UIDs

    def should_tell(self, pod: pods.Pod) -> bool:
        """Whether `pod`, a requester carrying a decision, is yet to be told."""
        created = pods.timestamp(pods.meta(pod).get("creationTimestamp"))
        recent = created is not None and time.time() - created < ANNOUNCE_WITHIN_S
        return recent and pods.uid(pod) not in self.told

    async def announce(self, name: str) -> None:
        pod = self.pods.get(f"{self.namespace}/{name}")
        decision = decided(pod) if pod is not None else None
        if pod is None or decision is None or pods.uid(pod) in self.told:
            return
        kind: EventType = "Warning" if decision.result is Result.INVALID else "Normal"
        await events.tell(self.events, pod, kind, decision.result.value, decision.why)
        self.told.add(pods.uid(pod))

    def forget(self, pod: pods.Pod) -> None:
        self.told.discard(pods.uid(pod))

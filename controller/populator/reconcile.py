"""The reconcile of one (Node, LauncherConfig) key: publish its launchers' phases, then bring their
number to the digest's target.

Bound launchers are never deleted and count toward the target. Unbound launchers made from an older
template are deleted (with UID and resourceVersion preconditions, so a launcher bound meanwhile
survives: such a conflict counts as present). Surplus unbound launchers are deleted in order of least
loss (warmth.py: no sleeping instances first, then the fewest sleeper bytes, the least recently used,
not-Ready, newest), each with an Event that says why it was the one. New launchers are created only
once nothing of the key is being deleted, so a node never holds old and new launchers at once, and every
create and delete is remembered until the cache shows it, so a lagging cache never causes a second create.
A create the API server refuses is reported (refusals.py) until one succeeds, and the key backed off. A
pass returns the work queue's Result (workqueue.py) and logs within its `pass_context` (the node and the
LauncherConfig).
"""

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Protocol

from kubernetes_asyncio.client.exceptions import ApiException

from controller import pods
from controller.launcher_template import Pod, pod_for_node
from controller.populator.digest import Digest, Target
from controller.populator.expectations import Expectations, PendingExpectations
from controller.populator.key import LauncherKey, key_fields
from controller.populator.kubeapi import DeleteOutcome, LauncherApi
from controller.populator.metrics import LauncherPodCount
from controller.populator.phases import Thresholds, phase_of, tally, template_hash
from controller.populator.refusals import Refusal, refusal_of
from controller.populator.stuck import report_stuck
from controller.populator.warmth import Warmth, loss
from kube.workqueue import DONE, Problem, Result, Wait, pass_context, sooner

log = logging.getLogger(__name__)


class LauncherCache(Protocol):
    """The informer caches, as the reconcile reads them."""

    def launchers(self, key: LauncherKey) -> list[Pod]: ...
    def has_node(self, name: str) -> bool: ...
    def warmth(self, pod: Pod) -> Warmth:
        """The launcher's sleeping instances, from its view."""
        ...


class RefusalSink(Protocol):
    async def refused(self, key: LauncherKey, refusal: Refusal | None) -> None:
        """The key's launchers could not be created (`refusal`), or could again (None)."""


def _utc_now() -> datetime:
    return datetime.now(UTC)


class KeyReconciler:
    """The key queue's reconcile function; its collaborators are passed in so tests can fake them."""

    def __init__(
        self,
        digest: Digest,
        cache: LauncherCache,
        api: LauncherApi,
        refusals: RefusalSink,
        expectations: PendingExpectations,
        metrics: LauncherPodCount,
        thresholds: Thresholds,
        recheck_after: float,
        clock: Callable[[], datetime] = _utc_now,
    ) -> None:
        self._digest = digest
        self._cache = cache
        self._api = api
        self._refusals = refusals
        self._expectations = expectations
        self._metrics = metrics
        self._thresholds = thresholds
        self._recheck_after = recheck_after
        self._clock = clock

    async def __call__(self, key: LauncherKey) -> Result:
        """Look again at the next stuck threshold crossing, or sooner while deletions or expectations are
        pending; back off while the API server refuses the key's creates."""
        with pass_context(**key_fields(key)):
            return await self._reconcile(key)

    async def _reconcile(self, key: LauncherKey) -> Result:
        now = self._clock()
        target = self._digest.target(key)
        cached = self._cache.launchers(key)
        counts, due = tally(cached, target.template_hash if target else None, self._thresholds, now)
        self._metrics.publish(key, counts)
        again = Wait((due - now).total_seconds(), "the next stuck threshold") if due is not None else DONE
        if target is None:
            log.debug("%s: hands-off, its LauncherConfig is missing or malformed", key)
            return again
        if not self._cache.has_node(key.node):
            log.debug("%s: the node is gone", key)
            return again
        if target.cordoned:
            log.debug("%s: the node is cordoned; its launchers are the drain's", key)
            return again
        match self._expectations.check(key):
            case Expectations.WAITING:
                return sooner(again, Wait(self._expectations.remaining(key), "the cache to show creates and deletes"))
            case Expectations.TIMED_OUT:
                log.info("%s: the cache has not shown recent creates and deletes; listing from the API server", key)
                launchers = await self._api.list_launchers(key)
                self._expectations.reset(key)
            case Expectations.SATISFIED:
                launchers = cached
        converged = await self._converge(key, target, launchers, now)
        return converged if isinstance(converged, Problem) else sooner(again, converged)

    async def _converge(self, key: LauncherKey, target: Target, launchers: list[Pod], now: datetime) -> Result:
        live = [pod for pod in launchers if not pods.is_deleting(pod)]
        bound = [pod for pod in live if pods.binding(pod) is not None]
        unbound = [pod for pod in live if pods.binding(pod) is None]
        # Costliest to lose first: surplus ones are deleted from the end.
        warmth = {pod["metadata"]["name"]: self._cache.warmth(pod) for pod in unbound}
        current = sorted(
            (p for p in unbound if template_hash(p) == target.template_hash),
            key=lambda pod: loss(pod, warmth[pod["metadata"]["name"]]),
            reverse=True,
        )
        stale = [p for p in unbound if template_hash(p) != target.template_hash]

        outcomes = [await self._delete(key, pod, "its template is outdated") for pod in stale]
        diff = target.count - (len(bound) + len(current) + outcomes.count(DeleteOutcome.CONFLICT))
        kept = list(current)
        surplus = -diff
        while surplus > 0 and kept:
            # A launcher picked here is not reported as stuck even if its delete conflicts: the next
            # reconcile decides again whether it stays.
            victim = kept.pop()
            name = victim["metadata"]["name"]
            why = (
                f"more launchers than the target {target.count}; of the {len(current)} unbound ones it holds the "
                f"least warm state ({warmth[name]})"
            )
            outcome = await self._delete(key, victim, why)
            if outcome is DeleteOutcome.DELETED:
                await self._api.note(victim, "LauncherScaledDown", f"deleting launcher {name}: {why}")
            outcomes.append(outcome)
            surplus -= outcome is not DeleteOutcome.CONFLICT

        await report_stuck(
            self._api, [(pod, phase_of(pod, target.template_hash, self._thresholds, now)[0]) for pod in [*bound, *kept]]
        )
        unsettled = (
            len(launchers) > len(live) or DeleteOutcome.DELETED in outcomes or DeleteOutcome.CONFLICT in outcomes
        )
        if unsettled:
            if diff > 0:
                log.info("%s: %d launchers to create once the deletions are done", key, diff)
            return Wait(self._recheck_after, "the deletions to be seen")
        # The missing launchers of a node at once (a GPU node asks for one per GPU), not one after another.
        results = await asyncio.gather(
            *(self._api.create(pod_for_node(target.template, target.template_hash, key.node)) for _ in range(diff)),
            return_exceptions=True,
        )
        for created in results:
            if not isinstance(created, BaseException) and self._cached(key, uid := created["metadata"]["uid"]) is None:
                self._expectations.expect_creation(key, uid)
        failed = next((r for r in results if isinstance(r, BaseException)), None)
        if isinstance(failed, ApiException):
            refusal = refusal_of(failed)
            await self._refusals.refused(key, refusal)
            return Problem.of(f"{refusal.reason}: {refusal.message}")  # reported; retried with back-off
        if failed is not None:
            raise failed
        await self._refusals.refused(key, None)
        return DONE

    async def _delete(self, key: LauncherKey, pod: Pod, why: str) -> DeleteOutcome:
        log.info("%s: deleting launcher %s: %s", key, pod["metadata"]["name"], why)
        outcome = await self._api.delete(pod)
        uid = pod["metadata"]["uid"]
        cached = self._cached(key, uid)
        if outcome is DeleteOutcome.DELETED and cached is not None and not pods.is_deleting(cached):
            self._expectations.expect_deletion(key, uid)
        return outcome

    def _cached(self, key: LauncherKey, uid: str) -> Pod | None:
        """The cache's copy of the Pod `uid`: when it is already there (or already deleting), the informer
        has seen the change and nothing needs to be expected."""
        return next((pod for pod in self._cache.launchers(key) if pod["metadata"]["uid"] == uid), None)

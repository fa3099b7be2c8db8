"""Leader election on a coordination.k8s.io/v1 Lease (E11), after client-go's leaderelection.

Replicas race to hold the Lease; the holder renews it every `retry_period`. Another replica takes
over once it has seen no renewal for `lease_duration` — measured on its own clock from when it saw
the record change, so clock skew between nodes does not matter. A leader that cannot renew within
`renew_deadline` stops leading (and the process exits, so Kubernetes restarts it as a follower).
"""

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from api.tasks import first_to_finish

log = logging.getLogger(__name__)


class LostLeadership(Exception):
    pass


class LeaderElection:
    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        name: str,
        identity: str,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
    ) -> None:
        self._leases = client.CoordinationV1Api(api)
        self.namespace, self.name, self.identity = namespace, name, identity
        self.lease_duration, self.renew_deadline, self.retry_period = lease_duration, renew_deadline, retry_period
        self._observed: tuple[str, float] | None = None  # (resourceVersion, local time seen)

    async def run(self, lead: Callable[[], Awaitable[None]]) -> None:
        """Wait for the lease, run `lead` while holding it; raise LostLeadership if it is lost."""
        while not await self._try_acquire_or_renew():  # noqa: ASYNC110 - polling the Lease is the protocol
            await asyncio.sleep(self.retry_period)
        log.info("%s became the leader (lease %s/%s)", self.identity, self.namespace, self.name)
        try:
            await first_to_finish(lead(), self._renew_until_lost())
        finally:
            await self._release()

    async def _renew_until_lost(self) -> None:
        last_renewal = time.monotonic()
        while True:
            await asyncio.sleep(self.retry_period)
            if await self._try_acquire_or_renew():
                last_renewal = time.monotonic()
            elif time.monotonic() - last_renewal > self.renew_deadline:
                raise LostLeadership(f"{self.identity} could not renew lease {self.namespace}/{self.name}")

    async def _try_acquire_or_renew(self) -> bool:
        now = datetime.now(UTC)
        try:
            lease = await self._leases.read_namespaced_lease(self.name, self.namespace)
        except ApiException as err:
            if err.status == 404:
                return await self._create(now)
            log.warning("cannot read lease %s/%s: %s", self.namespace, self.name, err.reason)
            return False
        spec = lease.spec
        version = lease.metadata.resource_version
        if self._observed is None or self._observed[0] != version:
            self._observed = (version, time.monotonic())
        holder = spec.holder_identity or ""
        expired = time.monotonic() - self._observed[1] > float(spec.lease_duration_seconds or 0)
        if holder and holder != self.identity and not expired:
            return False
        if holder != self.identity:
            spec.acquire_time = now
            spec.lease_transitions = (spec.lease_transitions or 0) + 1
        spec.holder_identity = self.identity
        spec.lease_duration_seconds = int(self.lease_duration)
        spec.renew_time = now
        try:
            updated = await self._leases.replace_namespaced_lease(self.name, self.namespace, lease)
        except ApiException as err:
            if err.status != 409:  # 409: another replica wrote it first
                log.warning("cannot update lease %s/%s: %s", self.namespace, self.name, err.reason)
            return False
        self._observed = (updated.metadata.resource_version, time.monotonic())
        return True

    async def _create(self, now: datetime) -> bool:
        body = client.V1Lease(
            metadata=client.V1ObjectMeta(name=self.name, namespace=self.namespace),
            spec=client.V1LeaseSpec(
                holder_identity=self.identity,
                lease_duration_seconds=int(self.lease_duration),
                acquire_time=now,
                renew_time=now,
                lease_transitions=0,
            ),
        )
        try:
            created = await self._leases.create_namespaced_lease(self.namespace, body)
        except ApiException as err:
            if err.status != 409:  # 409: another replica created it first
                log.warning("cannot create lease %s/%s: %s", self.namespace, self.name, err.reason)
            return False
        self._observed = (created.metadata.resource_version, time.monotonic())
        return True

    async def _release(self) -> None:
        """Hand the lease over at once instead of making the next leader wait for it to expire."""
        try:
            lease = await self._leases.read_namespaced_lease(self.name, self.namespace)
            if lease.spec.holder_identity != self.identity:
                return
            lease.spec.holder_identity = None
            lease.spec.lease_duration_seconds = 1
            await self._leases.replace_namespaced_lease(self.name, self.namespace, lease)
            log.info("%s released the lease", self.identity)
        except (ApiException, OSError) as err:
            log.warning("could not release lease %s/%s: %s", self.namespace, self.name, err)

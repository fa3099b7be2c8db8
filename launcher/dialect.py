"""What the launcher's API shows: dualpods' API (FMA's plus its additions), or FMA 0.6.4's alone.

The FMA-only mode (`--fma-only`, or LAUNCHER_FMA_ONLY=true) turns every addition off, so the launcher
stands in for FMA's own launcher when clients (our controllers among them) are tested against "a launcher
that speaks only FMA's API": no sleep and wake routes and no `/metrics`; instance states with FMA's keys
alone (a STOPPED event's object adds `exit_code`, as FMA's does); only CREATED, STOPPED and DELETED events,
whose revisions stay consecutive, with no `boot_id` and no heartbeat lines; errors as `{"detail"}` without
`reason`, and a 416 without a body; FMA's index; the dualpods fields of a create body ignored as unknown
fields are. What the launcher does beyond the API (validation before the fork, engine defaults, liveness)
is unchanged; the post-wake check is off, as no wake goes through the launcher.
"""

from dataclasses import dataclass
from typing import Any

from api.launcher import (
    FMA_EVENT_TYPES,
    FMA_STATE_KEYS,
    AllInstancesState,
    ErrorReason,
    EventType,
    InstanceIds,
    InstanceState,
    VllmConfig,
    WatchEvent,
)

# The body fields only dualpods' launcher reads (a create body may carry them for either).
EXTENSION_FIELDS = frozenset(VllmConfig.model_fields) - {"options", "gpu_uuids", "env_vars", "annotations"}


@dataclass(frozen=True)
class Dialect:
    fma_only: bool = False

    def publishes(self, event_type: EventType) -> bool:
        """Whether an event of this type is recorded at all (and so takes a revision)."""
        return not self.fma_only or event_type in FMA_EVENT_TYPES

    def config(self, config: VllmConfig) -> VllmConfig:
        """A create body as this launcher reads it."""
        return config.model_copy(update=dict.fromkeys(EXTENSION_FIELDS)) if self.fma_only else config

    def state(self, state: InstanceState) -> dict[str, Any]:
        shown = state.model_dump(mode="json", exclude_none=True)
        return {k: v for k, v in shown.items() if k in FMA_STATE_KEYS} if self.fma_only else shown

    def listing(self, listing: AllInstancesState) -> dict[str, Any]:
        shown = listing.model_dump(mode="json", exclude_none=True, exclude={"instances", "boot_id"})
        if not self.fma_only and listing.boot_id is not None:
            shown["boot_id"] = listing.boot_id
        return shown | {"instances": [self.state(i) for i in listing.instances]}

    def ids(self, ids: InstanceIds) -> dict[str, Any]:
        return ids.model_dump(mode="json", exclude_none=True, exclude={"boot_id"} if self.fma_only else set())

    def event(self, event: WatchEvent) -> dict[str, Any]:
        if not self.fma_only:
            return event.model_dump(mode="json", exclude_none=True)
        shown = self.state(event.object)
        if event.type is EventType.STOPPED:
            shown["exit_code"] = event.exit_code
        return {"type": event.type, "object": shown}

    def error(self, detail: str | list[dict[str, Any]], reason: ErrorReason) -> dict[str, Any]:
        return {"detail": detail} if self.fma_only else {"detail": detail, "reason": reason}

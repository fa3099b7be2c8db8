"""The placement decision for one Pod being created, as the mutating admission webhook asks for it.

The API server sends the requester Pods it is about to create that opted in (the webhook's match condition, kept
by the leader: webhook.py) in an AdmissionReview; the answer allows each always, with the JSON patch of the decision.
Opting in is checked again here (`choice.opted_in`: the condition may be a moment behind an ISC's change). A
requester that did not opt in, that is not in launcher mode, or whose ISC or
LauncherConfig this controller cannot read, is answered with no patch: exactly as created, placed as FMA places
it (the reconcile reports a missing ISC as it always did). Only the leader serves this; a follower or a stopped
controller is not called, or fails to answer, and the webhook's `failurePolicy: Ignore` lets the Pod through
unchanged: the stock scheduler places it.
"""

import base64
import dataclasses
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from api import keys
from api.crds import InferenceServerConfig, LauncherConfig
from controller import pods
from controller.dualpods.identity import runtime_of
from controller.dualpods.placement.choice import SCORED_IN_FULL, Decision, Result, choose, gpus_asked, opted_in, patch
from controller.dualpods.placement.claim_templates import ClaimTemplates
from controller.dualpods.placement.fleet import FleetReader, Reservations
from controller.launcher_template import TemplateError, node_independent_pod
from kube.informer import Obj

log = logging.getLogger(__name__)


class BadReview(ValueError):
    """The request is not an AdmissionReview this webhook can answer (a 400 for its sender)."""


@dataclass(frozen=True)
class PlacementOptions:
    default_on: bool = False  # for requesters that say nothing, nor their ISC
    launcher_token_secret: str | None = None  # as the launchers' template hash needs them (binding.py)
    launcher_runtime_class: str | None = None


class Placement:
    """Decides the placement of requesters at their creation, from the controller's caches and views."""

    def __init__(
        self,
        fleet: FleetReader,
        options: PlacementOptions,
        templates: ClaimTemplates | None = None,
        on_decision: Callable[[Decision], None] | None = None,
    ) -> None:
        self.fleet = fleet
        self.options = options
        self.templates = templates
        self.reservations = Reservations()
        self._on_decision = on_decision  # called with each Decision (the metrics)

    async def review(self, body: Any) -> Obj:
        """The AdmissionReview answer to `body`. BadReview when it is not a review of a Pod's creation."""
        request = body.get("request") if isinstance(body, dict) else None
        if not isinstance(request, dict) or not isinstance(request.get("uid"), str):
            raise BadReview("the body is not an AdmissionReview with a request and its uid")
        pod = request.get("object")
        if request.get("operation") != "CREATE" or not isinstance(pod, dict):
            raise BadReview("only the creation of a Pod is reviewed here")
        response: Obj = {"uid": request["uid"], "allowed": True}
        dry_run = bool(request.get("dryRun"))
        decision = self.decide(pod, request["uid"], dry_run)
        if decision is not None:
            templates = await self._claim_templates(pod, decision, dry_run)
            ops = patch(pod, decision, templates)
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(json.dumps(ops).encode()).decode()
        return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}

    def decide(self, pod: Obj, seed: str, dry_run: bool = False) -> Decision | None:
        """The decision for `pod` (None: leave it as created)."""
        annotations = pods.annotations(pod)
        isc_name = annotations.get(keys.INFERENCE_SERVER_CONFIG_ANNOTATION)
        if not isc_name or keys.SERVER_PATCH_ANNOTATION in annotations:
            return None
        namespace = self.fleet.namespace
        isc_obj = self.fleet.caches.iscs.get(f"{namespace}/{isc_name}")
        if isc_obj is None:
            return None
        try:
            isc = InferenceServerConfig.from_k8s(isc_obj)
        except ValidationError:
            return None  # the reconcile reports an invalid ISC
        try:
            if not opted_in(annotations, isc.metadata.annotations, self.options.default_on):
                return None
        except ValueError as err:
            return self._decided(Decision(Result.INVALID, str(err)))
        spec = pod.get("spec") or {}
        asked = gpus_asked(spec)
        if asked == 0:
            return self._decided(Decision(Result.NO_SLEEPER, "it asks the scheduler for no GPU: its GPU is pinned"))
        lc_obj = self.fleet.caches.lcs.get(f"{namespace}/{isc.spec.launcher_config_name}")
        if lc_obj is None:
            return None
        try:
            lc = LauncherConfig.from_k8s(lc_obj)
            runtime = runtime_of(annotations, isc.metadata.annotations)
            _, template_hash = node_independent_pod(
                lc, self.options.launcher_token_secret, self.options.launcher_runtime_class
            )
        except (ValueError, TemplateError):  # a pydantic ValidationError is a ValueError
            return None  # the reconcile reports what is wrong with the requester's ISC or LauncherConfig
        spots = {
            s: cost if asked is not None else dataclasses.replace(cost, uncertain=False)  # DRA: the claim names the GPU
            for s, cost in self.fleet.spots(isc, lc, template_hash, runtime, self.reservations.current()).items()
            if asked is None or len(s.gpus) == asked
        }
        nodes = {s.node: node for s in spots if (node := self.fleet.caches.nodes.get(s.node)) is not None}
        spot = choose(spots, nodes, spec, seed)
        if spot is None:
            why = f"no free GPU holds a sleeping instance of {isc_name} on a Node this requester may run on"
            return self._decided(Decision(Result.NO_SLEEPER, why))
        if not dry_run:
            self.reservations.add(spot)
        gpus = ",".join(spot.gpus)
        why = f"GPU {gpus} of Node {spot.node} holds {isc_name}'s sleeping instance {spot.instance} in {spot.launcher}"
        confined = self.fleet.confinement(spec, spot, SCORED_IN_FULL, seed)
        return self._decided(Decision(Result.PLACED_ON_SLEEPER, why, spot, confined))

    async def _claim_templates(self, pod: Obj, decision: Decision, dry_run: bool) -> dict[int, str]:
        """On DRA Nodes, the derived template (claim_templates.py) for each of the Pod's claims made from a template:
        by the index of the claim."""
        if decision.spot is None or dry_run or self.templates is None:
            return {}
        found: dict[int, str] = {}
        for index, claim in enumerate((pod.get("spec") or {}).get("resourceClaims") or []):
            template = claim.get("resourceClaimTemplateName")
            if template and (
                derived := await self.templates.prefer(self.fleet.namespace, template, decision.spot.gpus)
            ):
                found[index] = derived
        return found

    def _decided(self, decision: Decision) -> Decision:
        log.info("placement: %s: %s", decision.result.value, decision.why)
        if self._on_decision is not None:
            self._on_decision(decision)
        return decision

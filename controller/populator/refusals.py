"""Why the API server refused a launcher Pod, in words a platform team acts on.

A launcher the populator cannot create (a ResourceQuota is full, Pod Security or an admission policy
refuses its template, RBAC forbids it) was once only a line in the populator's log, retried with back-off
for ever. The key's reconcile now classifies the refusal, and the populator reports it where users look:
a Warning Event on each policy that asks for the launcher, and the policy's Ready condition (status.py),
until a create succeeds.
"""

import json
import re
from dataclasses import dataclass

from kubernetes_asyncio.client.exceptions import ApiException

QUOTA_EXCEEDED = "QuotaExceeded"
REFUSED_BY_ADMISSION = "RefusedByAdmission"
FORBIDDEN = "Forbidden"
INVALID = "Invalid"
CREATE_FAILED = "CreateFailed"
# The name the API server generated for a Pod it then refused: new on every retry and never a Pod anyone can
# look at, so it is left out (a refusal that only renamed the Pod is the same refusal).
_REFUSED_POD = re.compile(r'^pods "[^"]*" is forbidden: ')


@dataclass(frozen=True)
class Refusal:
    """A create the API server refused: `reason` (one of the names above, a condition reason) and its message."""

    reason: str
    message: str


def _message(error: ApiException) -> str:
    """The API server's own message (its Status body), else what the client knows."""
    for text in (error.body, error.reason):
        if isinstance(text, bytes):
            text = text.decode(errors="replace")
        if not text:
            continue
        try:
            status = json.loads(text)
        except ValueError:
            return str(text)
        if isinstance(status, dict) and status.get("message"):
            return str(status["message"])
        return str(text)
    return f"HTTP {error.status}"


def refusal_of(error: ApiException) -> Refusal:
    """Classify a refused create by what the API server said (quota and admission refusals are both 403s, or
    422 for an admission policy, and only their messages tell them apart)."""
    message = _REFUSED_POD.sub("", _message(error))
    if error.status == 403 and "exceeded quota" in message:
        return Refusal(QUOTA_EXCEEDED, message)
    admission = ("violates PodSecurity", "admission webhook", "ValidatingAdmissionPolicy", "denied request")
    if error.status in (400, 403, 422) and any(words in message for words in admission):
        return Refusal(REFUSED_BY_ADMISSION, message)
    if error.status == 403:
        return Refusal(FORBIDDEN, message)
    if error.status == 422:
        return Refusal(INVALID, message)
    return Refusal(CREATE_FAILED, message)

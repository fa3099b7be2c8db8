"""What a user reads in a requester's `dual-pods.llm-d.ai/status` annotation: FMA's `{"Errors": [...]}`."""

import json


class RequesterProblem(Exception):
    """Something the user should see in the requester's status. The work item retries with back-off, unless
    `retry` is False: then only a change to some object can settle it, and that change's event brings the next pass."""

    def __init__(self, *errors: str, retry: bool = True) -> None:
        super().__init__("; ".join(errors))
        self.errors = list(errors)
        self.retry = retry


def status_json(errors: list[str]) -> str:
    return json.dumps({"Errors": errors or None})

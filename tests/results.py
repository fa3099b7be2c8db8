"""Reading a reconcile pass's Result (kube/workqueue.py) in tests."""

from kube.workqueue import Problem, Result, Wait


def backs_off(result: Result) -> bool:
    """The pass ended in a problem that the work queue retries with back-off."""
    return isinstance(result, Problem) and result.retry


def terminal(result: Result) -> bool:
    """The pass ended in a problem only a change of some watched object settles: not retried."""
    return isinstance(result, Problem) and not result.retry


def again(result: Result) -> float | None:
    """When the work queue looks at the key again after this pass, if it waits for a time."""
    return result.after_s if isinstance(result, Wait) else None

"""Pending expectations (FMA's pending_expectations_test.go): creates and deletes made but not yet in
the cache keep a key waiting, until observed or timed out."""

from controller.populator.expectations import Expectations, PendingExpectations
from controller.populator.key import LauncherKey
from tests.test_populator_fakes import EXPECTATION_TIMEOUT, FakeMonotonic

KEY = LauncherKey("node-1", "lc-1")
OTHER = LauncherKey("node-2", "lc-1")


def expectations() -> tuple[PendingExpectations, FakeMonotonic]:
    clock = FakeMonotonic()
    return PendingExpectations(EXPECTATION_TIMEOUT, clock), clock


def test_a_key_without_expectations_is_satisfied() -> None:
    pending, _ = expectations()
    assert pending.check(KEY) is Expectations.SATISFIED
    assert pending.remaining(KEY) == 0


def test_creations_wait_until_the_cache_shows_each_of_them() -> None:
    pending, _ = expectations()
    for uid in ("a", "b", "c"):
        pending.expect_creation(KEY, uid)
    for uid in ("a", "b"):
        pending.observe_creation(KEY, uid)
        assert pending.check(KEY) is Expectations.WAITING
    pending.observe_creation(KEY, "c")
    assert pending.check(KEY) is Expectations.SATISFIED


def test_deletions_wait_until_the_cache_shows_each_of_them() -> None:
    pending, _ = expectations()
    pending.expect_deletion(KEY, "a")
    pending.expect_deletion(KEY, "b")
    pending.observe_deletion(KEY, "a")
    assert pending.check(KEY) is Expectations.WAITING
    pending.observe_deletion(KEY, "b")
    assert pending.check(KEY) is Expectations.SATISFIED


def test_observed_creations_do_not_satisfy_a_pending_deletion() -> None:
    pending, _ = expectations()
    pending.expect_creation(KEY, "new")
    pending.expect_deletion(KEY, "old")
    pending.observe_creation(KEY, "new")
    pending.observe_creation(KEY, "old")  # the cache still shows it: not a deletion
    assert pending.check(KEY) is Expectations.WAITING
    pending.observe_deletion(KEY, "old")
    assert pending.check(KEY) is Expectations.SATISFIED


def test_expectations_time_out() -> None:
    pending, clock = expectations()
    pending.expect_creation(KEY, "a")
    clock.now += EXPECTATION_TIMEOUT - 0.1
    assert pending.check(KEY) is Expectations.WAITING
    assert abs(pending.remaining(KEY) - 0.1) < 1e-9
    clock.now += 0.1
    assert pending.check(KEY) is Expectations.TIMED_OUT
    assert pending.remaining(KEY) == 0


def test_a_new_expectation_extends_the_deadline() -> None:
    pending, clock = expectations()
    pending.expect_creation(KEY, "a")
    clock.now += EXPECTATION_TIMEOUT - 1
    pending.expect_deletion(KEY, "b")
    clock.now += 2
    assert pending.check(KEY) is Expectations.WAITING
    assert pending.remaining(KEY) == EXPECTATION_TIMEOUT - 2


def test_reset_forgets_everything_pending() -> None:
    pending, clock = expectations()
    pending.expect_creation(KEY, "a")
    pending.expect_deletion(KEY, "b")
    clock.now += EXPECTATION_TIMEOUT
    pending.reset(KEY)
    assert pending.check(KEY) is Expectations.SATISFIED


def test_observing_what_was_not_expected_changes_nothing() -> None:
    pending, _ = expectations()
    pending.observe_creation(KEY, "someone-elses")
    pending.observe_deletion(KEY, "someone-elses")
    assert pending.check(KEY) is Expectations.SATISFIED
    pending.expect_creation(KEY, "a")
    pending.observe_creation(KEY, "b")
    assert pending.check(KEY) is Expectations.WAITING


def test_observing_twice_is_harmless() -> None:
    pending, _ = expectations()
    pending.expect_creation(KEY, "a")
    pending.observe_creation(KEY, "a")
    pending.observe_creation(KEY, "a")
    assert pending.check(KEY) is Expectations.SATISFIED
    pending.expect_creation(KEY, "b")  # a later create is expected afresh
    assert pending.check(KEY) is Expectations.WAITING


def test_keys_are_independent() -> None:
    pending, _ = expectations()
    pending.expect_creation(KEY, "a")
    pending.expect_deletion(OTHER, "b")
    pending.observe_deletion(OTHER, "b")
    assert pending.check(OTHER) is Expectations.SATISFIED
    assert pending.check(KEY) is Expectations.WAITING
    pending.observe_creation(OTHER, "a")  # the same UID under another key is not this key's
    assert pending.check(KEY) is Expectations.WAITING

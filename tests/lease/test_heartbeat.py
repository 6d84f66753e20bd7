"""A handler that runs longer than its lease: kept alive by the automatic heartbeat, or
taken over by a second attempt while the first can change nothing."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connections
from django.test import override_settings

from django_outbox.base.dialect import database_now
from django_outbox.conf import get_stream
from django_outbox.lease import heartbeat
from django_outbox.models import ArchivedEvent, GroupState, OutboxGroup, Outcome
from django_outbox.streams.attempt import AttemptOutcome, process_group
from django_outbox.streams.rescue import requeue_due_groups
from django_outbox.streams.run import claim_group
from django_outbox.transport import handoff
from tests.conftest import publish_unwoken
from tests.procs import held, in_forked_child, wait_until
from tests.testapp import handlers
from tests.testapp.models import HandledCall

pytestmark = pytest.mark.django_db(transaction=True)

LEASE = 1
SLOW = {"HANDLER": "tests.testapp.handlers.block_first_attempt", "LEASE_SECONDS": LEASE}


@pytest.fixture
def long_handler(request):
    """Run the first attempt of a claimed ``slow`` group in a thread, as a worker would.

    The stream's options come from the test's ``indirect`` parameter.
    """
    handlers.STARTED.clear()
    handlers.GO.clear()
    with override_settings(DJANGO_OUTBOX={"STREAMS": {"slow": request.param}}):
        yield from _first_attempt_running()


def _first_attempt_running():
    publish_unwoken("slow", [{"n": n} for n in range(5)])
    with handoff.capture():
        group_id = claim_group("slow").group_id
    outcomes: list[AttemptOutcome] = []

    def worker() -> None:
        try:
            outcomes.append(process_group("slow", group_id))
        finally:
            connections.close_all()

    thread = threading.Thread(target=worker)
    thread.start()
    assert handlers.STARTED.wait(10)
    yield group_id, outcomes
    handlers.GO.set()
    thread.join(30)
    assert not thread.is_alive()


def lease_left(group_id) -> float:
    group = OutboxGroup.objects.get(id=group_id)
    return (group.lease_expires_at - database_now()).total_seconds()


@pytest.mark.parametrize("long_handler", [SLOW], indirect=True)
def test_the_automatic_heartbeat_keeps_a_long_handlers_lease(long_handler):
    group_id, outcomes = long_handler
    # For three lease lengths the handler runs; its lease never runs out.
    until = time.monotonic() + 3 * LEASE
    while time.monotonic() < until:
        assert lease_left(group_id) > 0
        time.sleep(0.05)
    with handoff.capture() as rescued:
        assert requeue_due_groups(get_stream("slow")) == (0, 0)
    assert not rescued

    handlers.GO.set()
    wait_until(lambda: bool(outcomes), 10)
    assert outcomes == [AttemptOutcome.DONE]
    assert HandledCall.objects.filter(stream="slow").count() == 1
    assert ArchivedEvent.objects.filter(stream="slow", outcome=Outcome.DONE).count() == 5


@pytest.mark.parametrize("long_handler", [{**SLOW, "AUTO_HEARTBEAT": False}], indirect=True)
def test_without_a_heartbeat_a_second_attempt_runs_and_the_first_changes_nothing(long_handler):
    group_id, outcomes = long_handler
    wait_until(lambda: lease_left(group_id) < 0, 10)
    with handoff.capture() as rescued:
        assert requeue_due_groups(get_stream("slow")) == (1, 0)  # as distribute would
    assert OutboxGroup.objects.get(id=group_id).state == GroupState.CLAIMED
    [job] = rescued
    assert job.run() == [AttemptOutcome.DONE]  # attempt 2, on another worker

    handlers.GO.set()  # the first attempt returns, long after its lease
    wait_until(lambda: bool(outcomes), 10)
    assert outcomes == [AttemptOutcome.LEASE_LOST]
    calls = HandledCall.objects.filter(stream="slow").order_by("attempt")
    assert list(calls.values_list("attempt", flat=True)) == [1, 2]
    done = ArchivedEvent.objects.filter(stream="slow", outcome=Outcome.DONE)
    assert done.count() == 5 and set(done.values_list("attempts", flat=True)) == {2}
    assert not OutboxGroup.objects.exists()


def test_a_forked_child_beats_for_its_own_work_only():
    """A child forked while work of the parent runs (a handler, a task) and the keeper's
    thread holds its lock: the child's work gets a beat of its own, without waiting for
    a lock no thread of the child will release, and the parent's work is not the child's."""

    def child() -> list[object]:
        with heartbeat.beating(lambda: None, 3600, "child's"):
            return [beat.what for beat in heartbeat._beats.values()]

    with heartbeat.beating(lambda: None, 3600, "parent's"), held(heartbeat._lock):
        assert in_forked_child(child) == ["child's"]

"""The run loop: a commit wakes its stream, a run claims and processes on, then ends.

These tests run in autocommit (``transaction=True``), as an application's requests do,
so every commit's wake really runs; the run jobs it enqueues are kept in memory
(``InlineRunner.capturing``) and run here.
"""

from __future__ import annotations

import threading
from collections import deque
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django.db.models.functions import Now
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from django_outbox import publish, publish_many, wake
from django_outbox.archive.replay import replay_failed
from django_outbox.conf import get_stream
from django_outbox.models import (
    ArchivedEvent,
    GroupState,
    OutboxEvent,
    OutboxGroup,
    Outcome,
    StreamState,
)
from django_outbox.streams import run as runs_module
from django_outbox.streams.attempt import AttemptOutcome, exhaust_group
from django_outbox.streams.run import (
    claim_group,
    run_stream,
    start_runs,
    wake_now,
)
from django_outbox.streams.steer import set_paused
from django_outbox.transport import handoff
from marketing.models import ContactActivity, ContactActivityEvent, Lead
from tests.conftest import InlineRunner, publish_unwoken
from tests.testapp.models import HandledCall

pytestmark = pytest.mark.django_db(transaction=True)

AUDIT = {
    "HANDLER": "tests.testapp.handlers.record",
    "BATCH_SIZE": 10,
    "RUNS": 3,
    "MAX_ATTEMPTS": 3,
    "BACKOFF_SECONDS": 1,
    "LEASE_SECONDS": 120,
    "ISOLATE_FAILURES": False,  # a group dead-lettered whole (test_isolate.py splits)
}
SMALL = {"DJANGO_OUTBOX": {"STREAMS": {"audit": AUDIT}}}


def run_jobs(jobs) -> list[handoff.Job]:
    return [job for job in jobs if job.func == handoff.RUN]


def wanted() -> bool:
    return StreamState.objects.get(stream="audit").wanted


# -- work starts by itself ----------------------------------------------------------


def test_a_commit_that_published_starts_one_run_for_its_rows():
    runner = InlineRunner()
    with runner.capturing(), transaction.atomic():
        for n in range(5):
            publish("audit", {"n": n})
        assert not runner.jobs and not OutboxGroup.objects.exists()  # not before the commit

    assert len(run_jobs(runner.jobs)) == 1  # one wake per transaction, whatever the calls
    runner.drain()
    assert ArchivedEvent.objects.filter(outcome=Outcome.DONE).count() == 5
    assert not OutboxEvent.objects.exists()


def test_a_rolled_back_transaction_wakes_nothing():
    runner = InlineRunner()
    with runner.capturing(), pytest.raises(RuntimeError), transaction.atomic():
        publish_many("audit", [{"n": 1}])
        raise RuntimeError("rolled back")

    assert not runner.jobs
    assert not OutboxGroup.objects.exists()


def test_create_save_and_bulk_create_of_a_custom_buffer_wake_its_stream():
    lead = Lead.objects.create(name="Ada", email="ada@example.com")
    activity = ContactActivity.objects.create(lead=lead, kind="call")
    runner = InlineRunner()

    with runner.capturing():
        ContactActivityEvent.objects.create(activity=activity)
    assert len(run_jobs(runner.jobs)) == 1
    runner.drain()

    with runner.capturing():
        event = ContactActivityEvent(activity=activity)
        event.save()
    assert len(run_jobs(runner.jobs)) == 1
    runner.drain()

    with runner.capturing(), transaction.atomic():
        ContactActivityEvent.objects.bulk_create(
            [ContactActivityEvent(activity=activity) for _ in range(250)], batch_size=100
        )
    assert len(run_jobs(runner.jobs)) == 1  # three INSERTs, one commit, one wake
    runner.drain()

    assert not ContactActivityEvent.objects.exists()
    assert ArchivedEvent.objects.filter(stream="marketing", outcome=Outcome.DONE).count() == 252


def test_replayed_dead_letters_wake_their_stream(handler_mode):
    handler_mode("raise")
    runner = InlineRunner()
    with runner.capturing():
        publish_many("audit", [{"n": n} for n in range(3)])
    runner.drain()
    group = OutboxGroup.objects.get()
    OutboxGroup.objects.filter(pk=group.pk).update(attempt=3, state=GroupState.RUNNING)
    with transaction.atomic():
        exhaust_group(get_stream("audit"), group.pk, 3, "gave up")
    handler_mode("ok")

    with runner.capturing():
        replay_failed(ArchivedEvent.objects.filter(outcome=Outcome.FAILED, replayed_at=None))
    assert len(run_jobs(runner.jobs)) == 1
    runner.drain()

    assert ArchivedEvent.objects.filter(outcome=Outcome.DONE).count() == 3


def test_rows_written_without_the_orm_wait_for_distribute_or_a_wake():
    publish_unwoken("audit", [{"n": 1}, {"n": 2}])
    assert not OutboxGroup.objects.exists()
    runner = InlineRunner()

    with runner.capturing():
        wake("audit")  # outside a transaction: at once

    assert len(run_jobs(runner.jobs)) == 1
    runner.drain()
    assert ArchivedEvent.objects.count() == 2


def test_a_paused_stream_is_not_woken_and_resuming_wakes_it():
    set_paused("audit", True)
    runner = InlineRunner()
    with runner.capturing():
        publish_many("audit", [{"n": n} for n in range(4)])
    assert not runner.jobs and not OutboxGroup.objects.exists()

    with runner.capturing():
        set_paused("audit", False)

    assert len(run_jobs(runner.jobs)) == 1
    runner.drain()
    assert ArchivedEvent.objects.count() == 4


@override_settings(**SMALL)
def test_resuming_a_stream_with_a_backlog_starts_its_runs_at_once_up_to_chains():
    set_paused("audit", True)
    publish_unwoken("audit", [{"n": n} for n in range(45)])

    with handoff.capture() as jobs:
        set_paused("audit", False)

    # 45 rows fill 5 batches: RUNS (3) runs start now, not one that fans out later.
    assert len(run_jobs(jobs)) == 3
    with handoff.capture():
        for job in run_jobs(jobs):
            job.run()
    assert ArchivedEvent.objects.count() == 45 and not OutboxGroup.objects.exists()


# -- one run at a time, wanted again instead of a second run ---------------------------


def test_a_wake_while_a_run_is_in_flight_raises_wanted_instead_of_starting_a_run():
    runner = InlineRunner()
    with runner.capturing():
        publish_many("audit", [{"n": 1}])  # run 1 starts: its group is in flight
        publish_many("audit", [{"n": 2}])  # finds it: asks it to claim again
        publish_many("audit", [{"n": 3}])  # finds it wanted already: one read, no write

    assert len(run_jobs(runner.jobs)) == 1
    assert wanted()
    runner.drain()

    # The run processed its group, saw the flag after its short claim, lowered it and
    # claimed the other two rows; then its claim came back empty and it ended.
    assert [len(call.event_ids) for call in HandledCall.objects.order_by("id")] == [1, 2]
    assert not wanted()
    assert not OutboxEvent.objects.exists()


def test_the_wake_of_a_busy_and_wanted_stream_costs_one_query():
    runner = InlineRunner()
    with runner.capturing():
        publish_many("audit", [{"n": 1}])
        publish_many("audit", [{"n": 2}])
    assert wanted()

    with CaptureQueriesContext(connection) as queries:
        assert wake_now("audit") is False
    assert len(queries) == 1


@override_settings(**SMALL)
def test_a_run_goes_on_while_its_claims_are_full_and_starts_more_runs_up_to_chains():
    publish_unwoken("audit", [{"n": n} for n in range(95)])

    with handoff.capture() as jobs:
        outcomes = run_stream("audit")

    # This run claimed full batches on its own; its first full claim started two more
    # runs (RUNS 3), each with a reservation: a queued group of no rows. The fan-out
    # claimed nothing, and this run, alone here, went through every row. Ending with
    # every row claimed, it dropped the reservations no worker had taken.
    assert len(run_jobs(jobs)) == 2
    assert outcomes == [AttemptOutcome.DONE] * 10
    assert not OutboxEvent.objects.exists() and not OutboxGroup.objects.exists()
    calls = HandledCall.objects.count()
    with handoff.capture() as more:
        assert [job.run() for job in run_jobs(jobs)] == [[], []]  # their jobs do nothing
    assert not more and HandledCall.objects.count() == calls


@override_settings(**SMALL)
def test_a_reserved_run_claims_its_rows_when_it_runs_and_goes_on():
    publish_unwoken("audit", [{"n": n} for n in range(25)])
    with handoff.capture() as jobs:
        assert start_runs("audit", 2, reserve=True) == 2
    first, second = run_jobs(jobs)
    reservation = OutboxGroup.objects.get(pk=first.args[1])
    assert (reservation.size, reservation.state) == (0, GroupState.CLAIMED)
    assert not OutboxEvent.objects.filter(group_id__isnull=False).exists()  # none claimed

    with handoff.capture() as more:
        assert first.run() == ["done"] * 3  # its reservation's 10 rows, then 10, then 5
        # Started by a fan-out, it did not fan out again; ending, it dropped the
        # reservation no worker had taken: its job does nothing.
        assert second.run() == []
    assert not more
    (call, *_) = HandledCall.objects.order_by("id")
    assert call.group_id == reservation.pk and call.attempt == 1 and len(call.event_ids) == 10
    delivered = ArchivedEvent.objects.values_list("data__payload__n", flat=True)
    assert sorted(delivered) == list(range(25))
    assert not OutboxGroup.objects.exists()


@override_settings(**SMALL)
def test_a_commit_as_a_run_that_fanned_out_ends_is_not_left_to_its_dropped_reservations(
    monkeypatch,
):
    """The ending run drops its unstarted reservations under the lock a wake takes, before
    its last claim: a commit then sees no run in flight and starts one (or is waited
    for), never relies on a reservation that is dropped after it looked."""
    publish_unwoken("audit", [{"n": n} for n in range(25)])
    last_claim = runs_module._Run._last_claim
    late = []

    def commit_then_end(self):
        if not late:
            late.append(publish("audit", {"n": "late"}))  # its wake runs at once
        return last_claim(self)

    monkeypatch.setattr(runs_module._Run, "_last_claim", commit_then_end)
    with handoff.capture() as jobs:
        run_stream("audit")  # claims 10 (full: two reservations), 10, 5, then ends
        for job in list(run_jobs(jobs)):  # the reservations' jobs and any run started
            job.run()

    delivered = ArchivedEvent.objects.values_list("data__payload__n", flat=True)
    assert sorted(map(str, delivered)) == sorted([*map(str, range(25)), "late"])
    assert not OutboxGroup.objects.exists()


@override_settings(**SMALL)
def test_a_reserved_run_of_a_paused_stream_drops_its_reservation_and_claims_nothing():
    publish_unwoken("audit", [{"n": n} for n in range(5)])
    with handoff.capture() as jobs:
        start_runs("audit", 1, reserve=True)
    set_paused("audit", True)

    with handoff.capture():
        assert [job.run() for job in run_jobs(jobs)] == [[]]

    assert not OutboxGroup.objects.exists() and not HandledCall.objects.exists()
    assert OutboxEvent.objects.filter(group_id__isnull=True).count() == 5


@override_settings(**SMALL)
def test_a_claim_into_a_reservation_whose_lease_was_lost_claims_nothing():
    publish_unwoken("audit", [{"n": n} for n in range(5)])
    with handoff.capture():
        start_runs("audit", 1, reserve=True)
    reservation = OutboxGroup.objects.get()
    # Its run took it as attempt 1, then lost the lease: the group runs attempt 2 now.
    OutboxGroup.objects.update(state=GroupState.RUNNING, attempt=2)

    claim = claim_group("audit", run_here=True, reservation=(reservation.pk, 1))

    assert not claim.claimed_any
    assert OutboxEvent.objects.filter(group_id__isnull=True).count() == 5
    assert OutboxGroup.objects.get().size == 0  # left to the run that holds it


@override_settings(**SMALL)
def test_a_run_ends_on_a_short_claim_when_nothing_wanted_it():
    publish_unwoken("audit", [{"n": n} for n in range(4)])

    with handoff.capture() as jobs:
        outcomes = run_stream("audit")

    assert outcomes == [AttemptOutcome.DONE]
    assert not jobs
    assert not OutboxGroup.objects.exists()


@pytest.mark.postgres  # elsewhere a run's end takes no last claim (no wake guard)
@override_settings(**SMALL)
def test_a_run_that_read_its_stream_paused_goes_on_when_it_was_resumed_before_its_last_claim(
    monkeypatch,
):
    """The stream is paused when the run reads its state and resumed before the run's
    last claim: that claim's group is the run's to process (found by the interleaving
    harness, profile everything, seed 7: the group was dropped on the floor, its rows
    claimed by nobody until its lease ran out)."""
    publish_unwoken("audit", [{"n": n} for n in range(25)])
    read = runs_module.runtime_state
    reads: list[bool] = []

    def paused_at_first(stream: str) -> StreamState:
        state = read(stream)
        if not reads:
            state.paused = True  # the read saw a pause that ended right after it
        reads.append(state.paused)
        return state

    monkeypatch.setattr(runs_module, "runtime_state", paused_at_first)
    with handoff.capture():
        outcomes = run_stream("audit")

    assert reads[:2] == [True, False]
    assert outcomes == [AttemptOutcome.DONE] * 3
    assert not OutboxEvent.objects.exists() and not OutboxGroup.objects.exists()


@override_settings(**SMALL)
def test_a_run_past_its_budget_hands_its_next_group_to_a_fresh_job():
    publish_unwoken("audit", [{"n": n} for n in range(25)])

    with handoff.capture() as jobs:
        outcomes = run_stream("audit", budget=0)

    assert outcomes == []  # claimed, queued and handed over at once
    (job,) = run_jobs(jobs)
    group = OutboxGroup.objects.get()
    assert job.args == ("audit", str(group.pk)) and group.state == GroupState.CLAIMED


def test_a_duplicate_delivery_of_a_run_does_nothing():
    publish_unwoken("audit", [{"n": n} for n in range(3)])
    with handoff.capture() as jobs:
        claim_group("audit")
    (job,) = jobs

    with handoff.capture():
        assert job.run() == ["done"]
        assert job.run() == []

    assert HandledCall.objects.count() == 1


# -- claim ------------------------------------------------------------------------


def test_claim_takes_the_oldest_rows_up_to_the_batch_size_and_enqueues_one_run_job():
    publish_unwoken("audit", [{"n": i} for i in range(25)])
    ids = list(OutboxEvent.objects.order_by("id").values_list("id", flat=True))

    with handoff.capture() as jobs:
        result = claim_group("audit")

    assert result.size == 10 and result.full
    claimed = OutboxEvent.objects.filter(group_id=result.group_id)
    assert sorted(claimed.values_list("id", flat=True)) == ids[:10]
    group = OutboxGroup.objects.get(pk=result.group_id)
    assert (group.stream, group.size, group.state, group.attempt) == (
        "audit",
        10,
        GroupState.CLAIMED,
        0,
    )
    assert group.lease_expires_at is not None
    assert list(jobs) == [handoff.Job(handoff.RUN, ("audit", str(result.group_id)))]


def test_claims_never_overlap_and_the_last_one_is_partial():
    publish_unwoken("audit", [{"n": i} for i in range(25)])

    with handoff.capture():
        results = [claim_group("audit") for _ in range(4)]

    assert [r.size for r in results] == [10, 10, 5, 0]
    assert results[3].group_id is None
    assert OutboxEvent.objects.filter(group_id__isnull=True).count() == 0
    assert len({r.group_id for r in results[:3]}) == 3
    assert OutboxGroup.objects.count() == 3


def test_a_generic_stream_claims_only_its_own_rows():
    streams = {
        "audit": {"HANDLER": "tests.testapp.handlers.record", "BATCH_SIZE": 10},
        "mail": {"HANDLER": "tests.testapp.handlers.record", "BATCH_SIZE": 10},
    }
    with override_settings(DJANGO_OUTBOX={"STREAMS": streams}):
        publish_unwoken("mail", [{"to": i} for i in range(3)])
        publish_unwoken("audit", [{"n": i} for i in range(4)])
        with handoff.capture():
            result = claim_group("audit")

    assert result.size == 4
    claimed = OutboxEvent.objects.filter(group_id=result.group_id)
    assert set(claimed.values_list("stream", flat=True)) == {"audit"}
    assert OutboxEvent.objects.filter(stream="mail", group_id__isnull=True).count() == 3


def test_a_paused_stream_claims_nothing():
    publish_unwoken("audit", [{"n": i} for i in range(5)])
    set_paused("audit", True)

    with handoff.capture() as jobs:
        result = claim_group("audit")

    assert not result.claimed_any
    assert OutboxEvent.objects.filter(group_id__isnull=True).count() == 5
    assert not jobs


def test_the_batch_size_override_of_the_state_row_wins_over_settings():
    publish_unwoken("audit", [{"n": i} for i in range(10)])
    StreamState.objects.update_or_create(stream="audit", defaults={"batch_size_override": 3})

    with handoff.capture():
        assert claim_group("audit").size == 3


def test_a_group_claimed_to_run_here_starts_running_at_attempt_1_with_no_job():
    publish_unwoken("audit", [{"n": i} for i in range(3)])

    with handoff.capture() as jobs:
        result = claim_group("audit", run_here=True)

    group = OutboxGroup.objects.get(pk=result.group_id)
    assert (group.state, group.attempt, group.size) == (GroupState.RUNNING, 1, 3)
    assert group.worker and group.lease_expires_at is not None
    assert not jobs


# -- runs in flight are counted by their live groups ---------------------------------


@override_settings(**SMALL)
def test_start_runs_keeps_at_most_chains_in_flight():
    publish_unwoken("audit", [{"n": n} for n in range(100)])

    with handoff.capture() as jobs:
        assert start_runs("audit", 10) == 3
        assert start_runs("audit", 10) == 0

    assert len(run_jobs(jobs)) == 3
    assert wanted()  # the runs in flight claim again before they end


def test_a_group_whose_lease_expired_no_longer_holds_back_a_wake():
    publish_unwoken("audit", [{"n": n} for n in range(3)])
    with handoff.capture():
        dead = claim_group("audit", run_here=True)  # its worker dies here
    publish_unwoken("audit", [{"n": 9}])
    runner = InlineRunner()

    with runner.capturing():
        wake_now("audit")
    assert not runner.jobs and wanted()  # the dead run's lease is still live

    OutboxGroup.objects.filter(pk=dead.group_id).update(lease_expires_at=Now() - timedelta(1))
    with runner.capturing():
        wake_now("audit")

    assert len(run_jobs(runner.jobs)) == 1  # a new run for the new row
    runner.drain()
    assert ArchivedEvent.objects.count() == 1
    assert OutboxGroup.objects.get().pk == dead.group_id  # left to distribute's rescue


# -- the race between a run that ends and a commit that wakes ------------------------


@pytest.mark.postgres
@override_settings(**SMALL)
def test_no_commit_is_left_behind_by_a_run_that_ends_concurrently():
    """A publisher commits bursts of rows, one per transaction, while two workers run
    whatever the wakes enqueue. Every wake either finds a run that will claim again or
    starts one: when a burst has settled (no job queued or running), no row of it is left
    unclaimed, with no distribute at all. Each burst's end is a chance for the race."""
    shared: deque[handoff.Job] = deque()
    lock = threading.Lock()
    busy = [0]
    stop = threading.Event()
    errors: list[BaseException] = []
    stranded: list[int] = []
    bursts, per_burst = 60, 5

    def settled() -> bool:
        with lock:
            return not shared and not busy[0]

    def publisher() -> None:
        try:
            with handoff.capture() as queue:
                for burst in range(bursts):
                    for n in range(per_burst):
                        with transaction.atomic():
                            publish("audit", {"n": burst * per_burst + n})
                        with lock:
                            shared.extend(queue)
                        queue.clear()
                    while not settled():
                        stop.wait(0.001)
                    left = OutboxEvent.objects.filter(group_id__isnull=True).count()
                    if left:
                        stranded.append(left)
                        wake("audit")  # clean up, so later bursts are judged alone
                        with lock:
                            shared.extend(queue)
                        queue.clear()
        except BaseException as exc:  # reported by the test
            errors.append(exc)
        finally:
            stop.set()
            connections.close_all()

    def worker() -> None:
        try:
            with handoff.capture() as queue:
                while not stop.is_set() or shared:
                    with lock:
                        job = shared.popleft() if shared else None
                        busy[0] += job is not None
                    if job is None:
                        stop.wait(0.001)
                        continue
                    try:
                        job.run()
                    finally:
                        with lock:
                            shared.extend(queue)
                            busy[0] -= 1
                        queue.clear()
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=publisher)] + [
        threading.Thread(target=worker) for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)

    assert not errors, errors
    assert not any(thread.is_alive() for thread in threads)
    assert stranded == [], f"{len(stranded)} bursts left rows behind without a run"
    archived = list(ArchivedEvent.objects.values_list("data__payload__n", flat=True))
    assert sorted(archived) == list(range(bursts * per_burst))
    assert not OutboxGroup.objects.exists()

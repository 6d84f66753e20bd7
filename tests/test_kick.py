"""The kick: a commit that published to a stream with ``KICK`` on starts a claim at once.

Without it a row waits for the next distribute run (the schedule's minute); with it, for
the queue's poll interval. A claim that started before a recent kick continues once
more, so a kick folded into an earlier one (``KICK_DEBOUNCE``) never strands its rows.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.db.models import F
from django.test import override_settings

from django_outbox import kick, publish, publish_many, transport
from django_outbox.db import database_now
from django_outbox.models import OutboxEvent, StreamState
from django_outbox.streams import KICK_DEBOUNCE, continue_chain, set_paused, start_kicked_claim
from tests.procs import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

STREAM = {
    "HANDLER": "tests.testapp.handlers.record",
    "BATCH_SIZE": 10,
    "LEASE_SECONDS": 60,
}
KICKED = {"DJANGO_OUTBOX": {"STREAMS": {"audit": {**STREAM, "KICK": True}}}}
NOT_KICKED = {"DJANGO_OUTBOX": {"STREAMS": {"audit": STREAM}}}


def claims(jobs) -> int:
    return sum(1 for job in jobs if job.func == transport.CLAIM)


def state() -> StreamState:
    return StreamState.objects.get(stream="audit")


def age_last_kick(seconds: float) -> None:
    """Move the recorded kick into the past, as if that much time had gone by."""
    StreamState.objects.filter(stream="audit").update(
        kicked_at=F("kicked_at") - timedelta(seconds=seconds)
    )


@override_settings(**KICKED)
def test_a_commit_enqueues_one_claim_however_many_events_it_published():
    with transport.capture() as queue:
        with transaction.atomic():
            for n in range(30):
                publish("audit", {"n": n})
            publish_many("audit", [{"n": n} for n in range(30, 60)])
            assert claims(queue) == 0  # nothing before the commit

        assert claims(queue) == 1
    assert state().claims_in_flight == 1
    assert state().kicked_at is not None


@override_settings(**KICKED)
def test_a_rolled_back_transaction_kicks_nothing():
    class Rollback(Exception):
        pass

    with transport.capture() as queue:
        with pytest.raises(Rollback), transaction.atomic():
            publish("audit", {"n": 1})
            raise Rollback
        with transaction.atomic():
            with pytest.raises(Rollback), transaction.atomic():  # a savepoint
                publish("audit", {"n": 2})
                raise Rollback

    assert claims(queue) == 0
    assert not StreamState.objects.filter(stream="audit", kicked_at__isnull=False).exists()


@override_settings(**NOT_KICKED)
def test_without_kick_publishing_enqueues_nothing_but_kick_can_be_called():
    with transport.capture() as queue:
        publish("audit", {"n": 1})
        assert claims(queue) == 0

        with transaction.atomic():
            OutboxEvent.objects.create(stream="audit", payload={"n": 2})  # a custom path
            kick("audit")
            kick("audit")
        assert claims(queue) == 1


@override_settings(**KICKED)
def test_a_kick_while_a_claim_is_in_flight_records_itself_instead_of_enqueueing():
    with transport.capture() as queue:
        publish("audit", {"n": 1})
        first_kick = state().kicked_at
        publish("audit", {"n": 2})  # within the debounce: changes nothing
        assert state().kicked_at == first_kick

        age_last_kick(1)
        publish("audit", {"n": 3})

    assert claims(queue) == 1
    assert state().claims_in_flight == 1
    assert state().kicked_at > first_kick - timedelta(seconds=1)


@override_settings(**KICKED)
def test_a_paused_stream_is_not_kicked_into_claiming():
    set_paused("audit", True)
    with transport.capture() as queue:
        publish("audit", {"n": 1})

    assert claims(queue) == 0
    assert state().claims_in_flight == 0


@override_settings(**KICKED)
def test_a_claim_that_started_before_a_kick_continues_once_more():
    publish("audit", {"n": 1})  # kicked: one claim in flight
    before = database_now()
    age_last_kick(1)
    with transport.capture() as queue:
        start_kicked_claim("audit")  # recorded for the claim in flight
        assert claims(queue) == 0

        assert continue_chain("audit", full=False, started_at=before) is True
        assert claims(queue) == 1


@override_settings(**KICKED)
def test_a_claim_that_started_well_after_the_last_kick_ends_its_chain():
    publish("audit", {"n": 1})
    age_last_kick(10 * KICK_DEBOUNCE.total_seconds())

    with transport.capture() as queue:
        assert continue_chain("audit", full=False, started_at=database_now()) is False
    assert claims(queue) == 0
    assert state().claims_in_flight == 0


@pytest.mark.postgres
@override_settings(**KICKED)
def test_a_kick_racing_the_end_of_the_last_claim_in_flight_still_starts_a_claim(vendor):
    """The kick reads the state row while the last claim in flight is ending (its slot
    given back, not yet committed). Deciding on that read would only record the kick,
    and nothing would claim the kicked rows; the kick must decide under the row lock."""
    if vendor != "postgresql":
        pytest.skip("PostgreSQL tier: row locks between two sessions")
    publish("audit", {"n": 1})  # kicked: one claim in flight
    age_last_kick(1)  # the next kick is due
    ended = threading.Event()

    def waiting_on_a_lock() -> bool:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
            return cursor.fetchone()[0] > 0

    def last_claim_ends() -> None:
        try:
            with transaction.atomic():
                assert continue_chain("audit", full=False) is False  # slot given back
                ended.set()
                wait_until(waiting_on_a_lock, timeout=30, describe=lambda: "no kick waiting")
        finally:
            connection.close()

    claim = threading.Thread(target=last_claim_ends)
    claim.start()
    assert ended.wait(30)
    with transport.capture() as queue:
        started = start_kicked_claim("audit")  # blocks until the claim's commit
    claim.join(30)

    assert started is True
    assert claims(queue) == 1
    assert state().claims_in_flight == 1


@override_settings(**KICKED)
def test_kicked_claims_take_every_row_without_a_distribute_run():
    """Commits spread over time, each kicked; claims alone (no distribute) take them all."""
    with transport.capture() as queue:
        for n in range(25):
            publish("audit", {"n": n})
            age_last_kick(1)  # every commit is a kick of its own
            while queue:  # run what the kicks enqueued, as a worker would
                job = queue.popleft()
                job.run()

    assert OutboxEvent.objects.count() == 0
    assert state().claims_in_flight == 0


@override_settings(**KICKED)
def test_a_kick_folded_into_an_earlier_one_still_gets_its_rows_claimed():
    """The race the debounce must not lose: a claim takes its snapshot, then a row commits
    whose kick is folded into the kick that started that claim."""
    with transport.capture() as queue:
        publish("audit", {"n": 1})  # kick K1 enqueues claim C1
        assert claims(queue) == 1
        snapshot = database_now()  # C1 takes its snapshot here ...
        publish("audit", {"n": 2})  # ... this row commits after it, its kick is folded
        assert claims(queue) == 1

        # C1 ends without having seen row 2 and continues, so a successor will take it.
        assert continue_chain("audit", full=False, started_at=snapshot) is True
        assert claims(queue) == 2


@pytest.mark.process
@override_settings(**KICKED)
def test_a_real_cluster_processes_kicked_commits_with_no_distribute_at_all(tmp_path):
    """Commits trickle in one by one; no distribute ever runs (no schedule, no call), so
    only the kicks and their claims can move the rows."""
    from django_q.models import Schedule

    from django_outbox.models import ArchivedEvent, Outcome
    from tests.procs import fail_on_queue_failures, log_problems, qcluster, wait_until

    assert not Schedule.objects.exists(), "a schedule would distribute behind our back"
    published = []
    with qcluster(log=tmp_path / "qcluster.log") as cluster:
        for n in range(20):
            with transaction.atomic():
                published.append(publish("audit", {"n": n}))
            time.sleep(0.15)  # the inflow's pace: a commit every 150 ms
        wait_until(
            lambda: ArchivedEvent.objects.filter(stream="audit").count() == len(published),
            timeout=60,
            describe=lambda: {
                "archived": ArchivedEvent.objects.filter(stream="audit").count(),
                "buffer": OutboxEvent.objects.count(),
                "claims_in_flight": state().claims_in_flight,
            },
            watch=[cluster],
            check=fail_on_queue_failures,
        )
    assert log_problems(cluster) == []
    archived = ArchivedEvent.objects.filter(stream="audit")
    assert sorted(archived.values_list("event_id", flat=True)) == published
    assert set(archived.values_list("outcome", flat=True)) == {Outcome.DONE}
    assert OutboxEvent.objects.count() == 0
    latencies = sorted(
        (a.archived_at - a.created_at).total_seconds()
        for a in archived.only("created_at", "archived_at")
    )
    median, worst = latencies[len(latencies) // 2], latencies[-1]
    print(f"\nkicked commit -> archived: median {median:.2f}s, max {worst:.2f}s")


@pytest.mark.process
@override_settings(**KICKED)
def test_a_steady_inflow_above_what_distribute_alone_moves_stays_bounded(tmp_path):
    """DESIGN's throughput test: 40 commits/s for 15 s against a stream whose distribute
    alone moves MAX_BATCHES x BATCH_SIZE = 500 rows a minute (8 a second), with only the
    synced schedules and a real qcluster. The backlog stays within a few seconds of
    inflow, and once the inflow stops the rest drains with the schedule removed."""
    from django_q.models import Schedule

    from django_outbox.conf import get_stream
    from django_outbox.models import ArchivedEvent
    from django_outbox.schedules import sync_schedules
    from tests.procs import fail_on_queue_failures, log_problems, qcluster, wait_until

    config = get_stream("audit")
    rate, seconds = 40, 15
    assert rate * 60 > 4 * config.max_batches * config.batch_size
    sync_schedules()
    assert Schedule.objects.filter(func="django_outbox.tasks.distribute").count() == 1

    def unclaimed() -> int:
        return OutboxEvent.objects.filter(group_id__isnull=True).count()

    published, backlog = [], []
    with qcluster(log=tmp_path / "qcluster.log") as cluster:
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            tick = time.monotonic()
            with transaction.atomic():
                published.append(publish("audit", {"n": len(published)}))
            if len(published) % rate == 0:
                backlog.append(unclaimed())  # about once a second
            time.sleep(max(0.0, 1 / rate - (time.monotonic() - tick)))
        Schedule.objects.all().delete()  # from here on, no distribute can help
        wait_until(
            lambda: ArchivedEvent.objects.filter(stream="audit").count() == len(published),
            timeout=60,
            describe=lambda: {
                "archived": ArchivedEvent.objects.filter(stream="audit").count(),
                "published": len(published),
                "unclaimed": unclaimed(),
                "claims_in_flight": state().claims_in_flight,
            },
            watch=[cluster],
            check=fail_on_queue_failures,
        )
    assert log_problems(cluster) == []
    assert OutboxEvent.objects.count() == 0
    assert sorted(ArchivedEvent.objects.values_list("event_id", flat=True)) == published
    print(f"\n{len(published)} commits in {seconds}s; unclaimed backlog each second: {backlog}")
    # Bounded: never more than 5 seconds of inflow waiting. Distribute alone would let it
    # grow by about 32 rows every second (40 in, 8 out).
    assert max(backlog) <= 5 * rate, backlog

"""Ordered streams: the rows of one key reach the handler in id order, whatever happens.

Each test builds one way a later row of a key could overtake an earlier one (a second
group, a parallel run, a retry, a partial failure, a split, a rescue, a dead letter) and
checks that it does not; without ``ORDER_KEY`` each of them fails. They run on both
tiers; the concurrent claims of parallel runs need PostgreSQL (SQLite's write lock
serializes them).
"""

from __future__ import annotations

import contextlib
import io
import random
import threading
import time
import uuid
from collections import defaultdict
from datetime import timedelta
from unittest import mock

import pytest
from django.core.checks import run_checks
from django.core.management import call_command
from django.db import IntegrityError, connections, transaction
from django.db.models.functions import Now
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from django_outbox import publish, publish_many
from django_outbox.conf import get_stream
from django_outbox.exceptions import PayloadError
from django_outbox.models import (
    ArchivedEvent,
    GroupState,
    HeldKey,
    OutboxEvent,
    OutboxGroup,
    Outcome,
)
from django_outbox.streams import steer
from django_outbox.streams.attempt import AttemptOutcome, process_group
from django_outbox.streams.rescue import requeue_due_groups
from django_outbox.streams.run import claim_group, run_stream
from django_outbox.streams.sql import buffer_ops
from django_outbox.streams.status import stream_status
from django_outbox.streams.steer import release_keys
from django_outbox.transport import handoff
from tests.conftest import InlineRunner, unwoken
from tests.docs_examples import ordered
from tests.settings import DJANGO_OUTBOX, ORDERED_STREAM
from tests.testapp.models import HandledCall, OrderedEvent

pytestmark = pytest.mark.django_db(transaction=True)

STREAM = "ordered"
UUID = uuid.UUID("6f1c2a40-0000-4000-8000-000000000007")


def streams(**options: object) -> override_settings:
    """The test settings with the ordered stream's *options* changed."""
    return override_settings(
        DJANGO_OUTBOX={
            **DJANGO_OUTBOX,
            "STREAMS": {**DJANGO_OUTBOX["STREAMS"], STREAM: {**ORDERED_STREAM, **options}},
        }
    )


@pytest.fixture(autouse=True)
def _ordered_stream():
    with streams():
        yield


def add(*keys: str | None) -> list[int]:
    """Commit one row per key, in this order, without waking the stream; their ids."""
    with unwoken():
        rows = [OrderedEvent.objects.create(aggregate_id=key) for key in keys]
    return [row.id for row in rows]


def claim() -> set[int]:
    """Claim a group (its run job kept out of django-q2); the ids it took."""
    with handoff.capture():
        result = claim_group(STREAM)
    if result.group_id is None:
        return set()
    return set(OrderedEvent.objects.filter(group_id=result.group_id).values_list("id", flat=True))


def group_of(row_id: int) -> OutboxGroup:
    return OutboxGroup.objects.get(id=OrderedEvent.objects.get(id=row_id).group_id)


def process(group: OutboxGroup) -> AttemptOutcome:
    with handoff.capture():
        return process_group(STREAM, group.id)


def delivered() -> dict[str, list[int]]:
    """Each key's rows archived as done, in the order they were archived."""
    keys = dict(ArchivedEvent.objects.filter(stream=STREAM).values_list("event_id", "data"))
    found: dict[str, list[int]] = defaultdict(list)
    for event_id in (
        ArchivedEvent.objects.filter(stream=STREAM, outcome=Outcome.DONE)
        .order_by("id")
        .values_list("event_id", flat=True)
    ):
        found[keys[event_id]["aggregate_id"]].append(event_id)
    return dict(found)


def handed() -> list[list[int]]:
    """The rows of each handler call, in call order."""
    return list(
        HandledCall.objects.filter(stream=STREAM).order_by("id").values_list("event_ids", flat=True)
    )


def test_the_guides_settings_pass_the_system_checks():
    with override_settings(DJANGO_OUTBOX=ordered.DJANGO_OUTBOX):
        assert [m.id for m in run_checks() if m.id and m.id.startswith("django_outbox")] == []


# -- groups ---------------------------------------------------------------------------


def test_a_key_with_a_group_in_flight_is_not_claimed_again():
    a1, a2, b1 = add("a", "a", "b")
    assert claim() == {a1, a2, b1}

    _, c1, _, none = add("a", "c", "b", None)

    assert claim() == {c1, none}  # a and b wait for their group; a NULL key is not ordered


GENERIC = {"HANDLER": "tests.testapp.handlers.record", "ORDER_KEY": "account"}


def test_a_run_past_its_budget_hands_over_a_reservation_that_holds_no_key():
    """The fresh job claims when a worker runs it. A group claimed for it would hold its
    keys while the job waits for a worker, and the other runs, finding them in flight,
    would claim short groups of the few keys left (issue 39)."""
    ids = add("a", "b", "a")
    with handoff.capture() as jobs:
        assert run_stream(STREAM, budget=0) == []  # past its budget at once: handed over

    (job,) = [job for job in jobs if job.func == handoff.RUN]
    reservation = OutboxGroup.objects.get()
    assert job.args == (STREAM, str(reservation.pk)) and reservation.size == 0
    assert not OrderedEvent.objects.filter(group_id__isnull=False).exists()
    with handoff.capture():
        job.run()
    assert delivered() == {"a": [ids[0], ids[2]], "b": [ids[1]]}


@pytest.mark.parametrize("buffer", ["custom", "generic"])
def test_the_key_of_a_row_in_a_group_cannot_change_so_its_later_rows_wait(buffer):
    """An application that re-keys a claimed row would free its old key, and the key's
    later rows would overtake it: the UPDATE is refused; a waiting row may be re-keyed."""
    if buffer == "custom":
        model, key, stream = OrderedEvent, "aggregate_id", STREAM

        def row() -> int:
            return add("a")[0]
    else:
        model, key, stream = OutboxEvent, "order_key", "generic-ordered"

        def row() -> int:
            return buffer_ops(OutboxEvent).insert_event(stream, "{}", order_key="a")

    with (
        override_settings(
            DJANGO_OUTBOX={
                **DJANGO_OUTBOX,
                "STREAMS": {**DJANGO_OUTBOX["STREAMS"], stream: GENERIC},
            }
        )
        if buffer == "generic"
        else contextlib.nullcontext()
    ):
        a1 = row()
        with handoff.capture():
            first = claim_group(stream)
        assert model.objects.get(id=a1).group_id == first.group_id
        a2 = row()

        with pytest.raises(IntegrityError, match="ORDER_KEY of a buffer row in a group"):
            with transaction.atomic():
                model.objects.filter(id=a1).update(**{key: "b"})
        assert getattr(model.objects.get(id=a1), key) == "a"
        with handoff.capture():
            assert claim_group(stream).group_id is None  # a2 waits behind a1
        model.objects.filter(id=a1).update(**{key: "a"})  # the same key: allowed
        model.objects.filter(id=a2).update(**{key: "c"})  # a waiting row: free to change


def test_a_claim_takes_a_prefix_of_each_key_and_the_rest_waits():
    ids = add(*"aaaaaaaaaaaa")  # twelve rows of one key, batch size 10
    assert claim() == set(ids[:10])
    assert claim() == set()
    process(group_of(ids[0]))

    assert claim() == set(ids[10:])


# -- retries, partial failures --------------------------------------------------------


def test_a_key_whose_group_waits_for_a_retry_holds_its_later_rows(handler_mode):
    a1, b1 = add("a", "b")
    claim()
    handler_mode("raise")
    assert process(group_of(a1)) is AttemptOutcome.RETRYING
    a2, b2, c1 = add("a", "b", "c")

    assert claim() == {c1}

    handler_mode("ok")
    OutboxGroup.objects.filter(state=GroupState.RETRYING).update(next_attempt_at=Now())
    runner = InlineRunner()
    with runner.capturing():
        requeue_due_groups(get_stream(STREAM))
    runner.drain()
    assert delivered()["a"] == [a1, a2] and delivered()["b"] == [b1, b2]


def test_a_failed_row_keeps_the_later_rows_of_its_key_in_its_group(handler_mode):
    a1, b1, a2, b2, a3 = add("a", "b", "a", "b", "a")
    claim()
    handler_mode("fail-key:a")

    assert process(group_of(a1)) is AttemptOutcome.PARTIAL

    assert set(OrderedEvent.objects.values_list("id", flat=True)) == {a1, a2, a3}
    assert delivered() == {"b": [b1, b2]}
    group = group_of(a1)
    assert group.row_errors[str(a2)] == f"held behind row {a1} of its key"


# -- splits -----------------------------------------------------------------------------


@pytest.mark.parametrize("keys", ["aabbccdd", "abcdabcd", "aaaaaabc"])
def test_failure_isolation_splits_a_group_by_keys(handler_mode, keys):
    ids = add(*keys)
    claim()
    handler_mode("raise")
    process(group_of(ids[0]))
    OutboxGroup.objects.update(next_attempt_at=Now())
    with handoff.capture():
        requeue_due_groups(get_stream(STREAM))
    assert process(group_of(ids[0])) is AttemptOutcome.SPLIT  # the second failure in a row

    halves = OutboxGroup.objects.all()
    assert len(halves) == 2
    key_sets = [
        set(OrderedEvent.objects.filter(group_id=half.id).values_list("aggregate_id", flat=True))
        for half in halves
    ]
    assert not key_sets[0] & key_sets[1]
    assert sorted(half.size for half in halves) != [0, len(ids)]


def test_a_group_of_one_key_does_not_split(handler_mode):
    ids = add(*"aaaa")
    claim()
    handler_mode("raise")
    process(group_of(ids[0]))
    OutboxGroup.objects.update(next_attempt_at=Now())
    with handoff.capture():
        requeue_due_groups(get_stream(STREAM))

    assert process(group_of(ids[0])) is AttemptOutcome.RETRYING
    assert OutboxGroup.objects.count() == 1


# -- rescues ----------------------------------------------------------------------------


def test_a_crashed_workers_group_holds_its_keys_until_it_is_rescued_and_delivered():
    a1, _ = add("a", "b")
    claim()
    group = group_of(a1)
    # Its worker took the lease and died: the lease runs out.
    OutboxGroup.objects.filter(id=group.id).update(
        state=GroupState.RUNNING, attempt=1, lease_expires_at=Now() - timedelta(seconds=1)
    )
    a2, c1 = add("a", "c")

    assert claim() == {c1}

    runner = InlineRunner()
    with runner.capturing():
        assert requeue_due_groups(get_stream(STREAM)) == (1, 0)
    runner.drain()
    assert delivered()["a"] == [a1, a2]


# -- dead letters -----------------------------------------------------------------------


def exhaust_key_a(handler_mode) -> tuple[int, int]:
    """Dead-letter a group holding key a; add a later row of it. Their ids."""
    (a1,) = add("a")
    claim()
    handler_mode("raise")
    group = group_of(a1)
    OutboxGroup.objects.filter(id=group.id).update(attempt=2)  # its last attempt next
    assert process(group) is AttemptOutcome.EXHAUSTED
    handler_mode("ok")
    (a2,) = add("a")
    return a1, a2


def test_a_dead_letter_holds_its_key_until_an_operator_releases_it(handler_mode):
    a1, a2 = exhaust_key_a(handler_mode)
    (b1,) = add("b")

    assert claim() == {b1}
    assert list(HeldKey.objects.values_list("stream", "key")) == [(STREAM, "a")]
    assert stream_status(STREAM).held_keys == 1
    report = io.StringIO()
    call_command("outbox_status", stdout=report)
    assert f"1 key(s) of {STREAM} are held by a dead letter" in report.getvalue()
    process(group_of(b1))

    runner = InlineRunner()
    with runner.capturing():
        assert release_keys(STREAM, ["a"]) == 1  # wakes the stream
    runner.drain()
    assert delivered()["a"] == [a2]
    assert ArchivedEvent.objects.get(event_id=a1).outcome == Outcome.FAILED


def test_the_guides_procedure_delivers_a_held_dead_letter_before_the_later_rows(handler_mode):
    """docs/how-to/ordered-streams.md, Held keys, step by step: rows 0-4 of one key, row
    2 poisoned, are dead-lettered from row 2 on; rows 5-7 are published after. Replay
    the dead letter (``outbox_replay --group``), then release the key: the handler
    delivers the key's rows in their order, 0 to 7."""
    seqs = [OrderedEvent(aggregate_id="a", seq=n) for n in range(5)]
    with unwoken():
        OrderedEvent.objects.bulk_create(seqs)
    assert claim()
    group = group_of(seqs[0].id)
    OutboxGroup.objects.filter(id=group.id).update(attempt=2)  # its last attempt next
    handler_mode("fail-seq:2")
    assert process(group) is AttemptOutcome.EXHAUSTED  # 0, 1 done; 2, 3, 4 dead letters
    handler_mode("ok")
    with unwoken():
        OrderedEvent.objects.bulk_create(OrderedEvent(aggregate_id="a", seq=n) for n in (5, 6, 7))
    assert list(HeldKey.objects.values_list("key", "group_id")) == [("a", group.id)]

    runner = InlineRunner()
    with runner.capturing():
        call_command("outbox_replay", "--group", str(group.id), stdout=io.StringIO())
        release_keys(STREAM, ["a"])
    runner.drain()

    by_event = {
        event_id: data["seq"]
        for event_id, data in ArchivedEvent.objects.filter(stream=STREAM).values_list(
            "event_id", "data"
        )
    }
    assert [by_event[event_id] for event_id in delivered()["a"]] == list(range(8))
    assert not OutboxEvent.objects.exists() and not OrderedEvent.objects.exists()


@streams(ORDER_AFTER_DEAD_LETTER="continue")
def test_with_continue_a_dead_letter_lets_its_key_go_on(handler_mode):
    _, a2 = exhaust_key_a(handler_mode)

    assert claim() == {a2}
    assert not HeldKey.objects.exists()


@streams(ORDER_AFTER_DEAD_LETTER="continue")
def test_dead_lettering_from_the_admin_wakes_the_keys_later_rows(handler_mode):
    (a1,) = add("a")
    claim()
    handler_mode("raise")
    assert process(group_of(a1)) is AttemptOutcome.RETRYING
    handler_mode("ok")
    (a2,) = add("a")

    runner = InlineRunner()
    with runner.capturing():
        steer.dead_letter([group_of(a1).id], "dead-lettered from the admin")
    runner.drain()

    assert delivered() == {"a": [a2]}


# -- the whole pipeline -----------------------------------------------------------------


def test_many_keys_through_failures_retries_splits_and_rescues_stay_in_order(handler_mode):
    """Random keys, random failures, rescued leases: each key's deliveries in id order."""
    rng = random.Random(29)
    keys = [f"k{n}" for n in range(8)]
    expected: dict[str, list[int]] = defaultdict(list)
    runner = InlineRunner()
    for round_ in range(12):
        batch = [rng.choice(keys) for _ in range(rng.randint(1, 15))]
        for key, row_id in zip(batch, add(*batch), strict=True):
            expected[key].append(row_id)
        handler_mode(rng.choice(["ok", "ok", "raise", f"fail-key:{rng.choice(keys)}"]))
        with runner.capturing():
            claim_group(STREAM)
        if round_ % 4 == 3:  # a worker dies holding a group
            OutboxGroup.objects.filter(state=GroupState.CLAIMED).update(
                lease_expires_at=Now() - timedelta(seconds=1)
            )
        runner.drain()
        OutboxGroup.objects.filter(state=GroupState.RETRYING).update(next_attempt_at=Now())
        runner.distribute(STREAM)
    handler_mode("ok")
    for _ in range(30):
        if not OrderedEvent.objects.exists():
            break
        OutboxGroup.objects.filter(state=GroupState.RETRYING).update(next_attempt_at=Now())
        OutboxGroup.objects.update(lease_expires_at=Now() - timedelta(seconds=1))
        runner.distribute(STREAM)
        runner.drain()
    for key in list(HeldKey.objects.values_list("key", flat=True)):
        with runner.capturing():
            release_keys(STREAM, [key])
        runner.drain()

    failed = set(
        ArchivedEvent.objects.filter(outcome=Outcome.FAILED).values_list("event_id", flat=True)
    )
    assert not OrderedEvent.objects.exists()
    assert delivered() == {
        key: [i for i in ids if i not in failed]
        for key, ids in expected.items()
        if any(i not in failed for i in ids)
    }
    # Every handler call saw each key's rows in id order, and never a key's row before
    # an earlier one of the key that had not been delivered yet.
    for call in handed():
        assert call == sorted(call)


# -- parallel runs (PostgreSQL: concurrent claims) --------------------------------------


def waiting_for_a_lock() -> bool:
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT COUNT(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND datname = current_database()"
        )
        return cursor.fetchone()[0] > 0


@pytest.mark.postgres
def test_a_claim_concurrent_with_another_does_not_skip_its_rows_to_take_later_ones():
    """The first claim holds its rows, uncommitted; a parallel run's claim must not step
    over them (SKIP LOCKED) to take the key's later rows."""
    ids = add(*"aaaaaaaaaaaa")  # twelve rows, batch size 10
    first_claimed, release = threading.Event(), threading.Event()
    taken: list[set[int]] = []
    second: list[set[int]] = []

    def first() -> None:
        try:
            with transaction.atomic():
                taken.append(claim())  # held, uncommitted, until the test says so
                first_claimed.set()
                release.wait(30)
        finally:
            connections.close_all()

    def other() -> None:
        try:
            second.append(claim())
        finally:
            connections.close_all()

    holder = threading.Thread(target=first)
    holder.start()
    assert first_claimed.wait(30)
    parallel = threading.Thread(target=other)
    parallel.start()
    deadline = time.monotonic() + 30
    while parallel.is_alive() and not waiting_for_a_lock():  # it waits, or it is done
        assert time.monotonic() < deadline
        time.sleep(0.01)
    release.set()  # the first claim commits; a waiting second claim goes on
    holder.join(30)
    parallel.join(30)

    assert taken == [set(ids[:10])]
    assert second == [set()]


# -- the generic buffer ---------------------------------------------------------------

GENERIC = {
    "HANDLER": "tests.testapp.handlers.record",
    "ORDER_KEY": "order_id",
    "BATCH_SIZE": 10,
    "MAX_ATTEMPTS": 3,
    "BACKOFF_SECONDS": 1,
    "LEASE_SECONDS": 120,
}


def generic_streams() -> override_settings:
    """Two ordered streams of the generic buffer, keyed by the same payload key."""
    return override_settings(
        DJANGO_OUTBOX={
            **DJANGO_OUTBOX,
            "STREAMS": {**DJANGO_OUTBOX["STREAMS"], "orders": GENERIC, "refunds": GENERIC},
        }
    )


def publish_keys(stream: str, *keys: object, **extra: object) -> list[int]:
    """Publish one event per key (committed, the stream not woken); their ids."""
    # (publish() wakes through the wake guard on PostgreSQL, else after its commit.)
    with mock.patch("django_outbox.streams.publish.wake"):
        with mock.patch("django_outbox.streams.run.wake"):
            return [publish(stream, {"order_id": key, **extra}) for key in keys]


def generic_claim(stream: str = "orders") -> set[int]:
    with handoff.capture():
        result = claim_group(stream)
    if result.group_id is None:
        return set()
    return set(OutboxEvent.objects.filter(group_id=result.group_id).values_list("id", flat=True))


def test_an_order_key_on_the_generic_buffer_names_a_payload_key():
    with generic_streams():
        assert [m for m in run_checks() if m.id and m.id.startswith("django_outbox")] == []
    guide = {
        **DJANGO_OUTBOX,
        "STREAMS": {**DJANGO_OUTBOX["STREAMS"], **ordered.GENERIC_OUTBOX["STREAMS"]},
    }
    with override_settings(DJANGO_OUTBOX=guide):
        assert [m.id for m in run_checks() if m.id and m.id.startswith("django_outbox")] == []
        with mock.patch("django_outbox.streams.publish.wake"):
            with mock.patch("django_outbox.streams.run.wake"):
                event_id = ordered.order_paid(7)
    assert OutboxEvent.objects.get(id=event_id).order_key == "7"


def test_publish_writes_the_payload_keys_value_in_its_one_insert():
    with generic_streams(), handoff.capture():
        with CaptureQueriesContext(connections["default"]) as queries:
            event_id = publish("orders", {"order_id": 7, "total": "9.50"})
        table = connections["default"].ops.quote_name(OutboxEvent._meta.db_table)
        inserts = [
            q["sql"]
            for q in queries.captured_queries
            if q["sql"].startswith(f"INSERT INTO {table}")
        ]
        assert len(inserts) == 1 and "order_key" in inserts[0]  # the one statement
        publish_many("orders", [{"order_id": "a"}, {"no": "key"}, {"order_id": None}, [1]])
        publish("audit", {"order_id": 7})  # an unordered stream: no key
    assert OutboxEvent.objects.get(id=event_id).order_key == "7"
    assert list(OutboxEvent.objects.order_by("id").values_list("stream", "order_key")) == [
        ("orders", "7"),
        ("orders", "a"),
        ("orders", None),
        ("orders", None),
        ("orders", None),
        ("audit", None),
    ]


@pytest.mark.parametrize("value", [1.5, True, {"id": 1}, [1], "x" * 256])
def test_a_key_value_that_cannot_order_a_row_is_refused_and_nothing_written(value):
    with generic_streams(), handoff.capture():
        with pytest.raises(PayloadError, match="order_id"):
            publish("orders", {"order_id": value})
        with pytest.raises(PayloadError, match="order_id"):
            publish_many("orders", [{"order_id": 1}, {"order_id": value}])
    assert not OutboxEvent.objects.exists()


def test_a_key_of_the_generic_buffer_with_a_group_in_flight_is_not_claimed_again():
    with generic_streams():
        a1, a2, b1 = publish_keys("orders", "a", "a", "b")
        assert generic_claim() == {a1, a2, b1}
        _, c1, _, none, uuid_key = publish_keys("orders", "a", "c", "b", None, UUID)

        assert generic_claim() == {c1, none, uuid_key}  # a and b wait; NULL is not ordered
        assert OutboxEvent.objects.get(id=uuid_key).order_key == str(UUID)


def test_the_same_key_in_another_stream_of_the_generic_buffer_is_another_key():
    with generic_streams():
        (orders_a,) = publish_keys("orders", "a")
        assert generic_claim("orders") == {orders_a}
        refunds_a, refunds_a2 = publish_keys("refunds", "a", "a")

        assert generic_claim("refunds") == {refunds_a, refunds_a2}  # not held by orders' a
        publish_keys("orders", "a")
        assert generic_claim("orders") == set()  # orders' a is in flight


def test_a_failed_row_of_the_generic_buffer_keeps_its_keys_later_rows(handler_mode):
    with generic_streams():
        (a1,) = publish_keys("orders", "a", fail=True)
        b1, a2 = publish_keys("orders", "b", "a")
        assert generic_claim() == {a1, b1, a2}
        handler_mode("fail-marked")
        group = OutboxEvent.objects.get(id=a1).group_id
        with handoff.capture():
            assert process_group("orders", group) is AttemptOutcome.PARTIAL

        assert set(OutboxEvent.objects.values_list("id", flat=True)) == {a1, a2}
        assert OutboxGroup.objects.get(id=group).row_errors[str(a2)] == (
            f"held behind row {a1} of its key"
        )
        publish_keys("orders", "a")
        assert generic_claim() == set()  # the key waits for its group
        assert ArchivedEvent.objects.filter(stream="orders").count() == 1  # b1

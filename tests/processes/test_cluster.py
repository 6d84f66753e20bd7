"""Process tier: the pipeline end to end through a real ``qcluster`` (django-q2, ORM broker).

The cluster is a subprocess on the test database with the settings as they are in
tests/settings.py (``override_settings`` does not reach a child). No django-q2 schedule
exists in the test database, so no distribute runs unless a test makes one: the commit
that wrote the rows starts a run, and everything after it is the cluster's own work.
"""

from __future__ import annotations

import math
import time
from collections import Counter

import pytest
from django.db import connection, transaction
from django.db.models import Count
from django.utils import timezone
from django_q.models import OrmQ, Schedule

from django_outbox import publish_many
from django_outbox.conf import get_stream
from django_outbox.models import (
    ArchivedEvent,
    GroupState,
    OutboxEvent,
    OutboxGroup,
    Outcome,
    StreamState,
)
from django_outbox.transport import handoff
from marketing.models import ApiRequest, ContactActivity, ContactActivityEvent, Lead
from tests.procs import (
    fail_on_queue_failures,
    log_problems,
    qcluster,
    queue_failures,
    wait_until,
)
from tests.testapp.models import HandledCall

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]

DEADLINE = 120  # seconds; a drain normally takes 2-20 (SQLite/PostgreSQL, idle/loaded)


def pipeline_state(stream: str, buffer_model) -> dict[str, object]:
    """What the database says about *stream* right now (for waits and their failures)."""
    state = StreamState.objects.filter(stream=stream).values("wanted", "paused").first()
    return {
        "unclaimed": buffer_model.objects.filter(group_id__isnull=True).count(),
        "buffer": buffer_model.objects.count(),
        "groups": dict(
            OutboxGroup.objects.filter(stream=stream)
            .values_list("state")
            .annotate(n=Count("id"))
            .order_by()
        ),
        "archived": ArchivedEvent.objects.filter(stream=stream).count(),
        "queued_jobs": dict(queued_funcs()),
        "state": state,
        "queue_failures": len(queue_failures()),
    }


def drained(stream: str, buffer_model) -> bool:
    """Buffer empty, no group left, no job queued or running."""
    return (
        not buffer_model.objects.exists()
        and not OutboxGroup.objects.filter(stream=stream).exists()
        and not OrmQ.objects.exists()
    )


def queued_funcs() -> Counter:
    """The task functions waiting in the ORM broker's queue."""
    from django_q.signing import SignedPackage

    return Counter(SignedPackage.loads(row.payload)["func"] for row in OrmQ.objects.all())


def assert_archived_once_done(stream: str, published: set[int]) -> list[tuple]:
    archived = list(
        ArchivedEvent.objects.filter(stream=stream).values_list(
            "event_id", "outcome", "group_id", "attempts"
        )
    )
    ids = Counter(event_id for event_id, *_ in archived)
    duplicated = sorted(event_id for event_id, n in ids.items() if n > 1)
    missing = published - set(ids)
    unexpected = set(ids) - published
    assert (len(missing), len(duplicated), len(unexpected)) == (0, 0, 0), (
        f"missing {sorted(missing)[:20]}, archived twice {duplicated[:20]}, "
        f"never published {sorted(unexpected)[:20]}"
    )
    assert Counter(outcome for _, outcome, *_ in archived) == {Outcome.DONE: len(published)}
    return archived


def assert_groups_of_one_batch(archived: list[tuple], batch_size: int, chains: int) -> Counter:
    """Full groups, but for at most one short group per run at the backlog's tail (where
    concurrent claims may interleave)."""
    group_sizes = Counter(group_id for _, _, group_id, _ in archived)
    short = [size for size in group_sizes.values() if size < batch_size]
    assert max(group_sizes.values()) == batch_size
    assert len(short) <= chains, f"group sizes: {Counter(group_sizes.values())}"
    return group_sizes


def test_one_commit_drains_a_generic_backlog_through_the_run_loop(tmp_path):
    """2,000 events of ``audit`` (BATCH_SIZE 10) in one commit: the commit starts one run,
    whose full claims start more (up to RUNS); no distribute runs at all."""
    events, config = 2_000, get_stream("audit")
    assert not Schedule.objects.exists(), "a schedule would distribute behind our back"

    publish_many("audit", ({"n": n} for n in range(events)))  # one transaction, one wake

    published = set(OutboxEvent.objects.values_list("id", flat=True))
    assert len(published) == events
    assert queued_funcs() == {handoff.RUN: 1}, "the commit hands one run to the queue"
    started = time.monotonic()
    with qcluster(log=tmp_path / "qcluster.log") as cluster:
        wait_until(
            lambda: drained("audit", OutboxEvent),
            timeout=DEADLINE,
            describe=lambda: pipeline_state("audit", OutboxEvent),
            watch=[cluster],
            check=fail_on_queue_failures,
        )
        seconds = time.monotonic() - started
    print(f"\nqcluster drained {events:,} audit events from one commit: {seconds:.1f}s")

    assert queue_failures() == []
    assert log_problems(cluster) == []
    archived = assert_archived_once_done("audit", published)
    assert {attempts for *_, attempts in archived} == {1}
    group_sizes = assert_groups_of_one_batch(archived, config.batch_size, config.runs)
    # One handler call per group, never one per event; each saw exactly its group.
    calls = list(HandledCall.objects.values_list("group_id", "attempt", "event_ids"))
    assert len(calls) == len(group_sizes)
    members: dict = {}
    for event_id, _, group_id, _ in archived:
        members.setdefault(group_id, set()).add(event_id)
    assert {group_id: set(event_ids) for group_id, _, event_ids in calls} == members
    assert {attempt for _, attempt, _ in calls} == {1}


def test_bulk_create_of_a_custom_buffer_drains_in_bulk_requests(tmp_path):
    """6,000 marketing activities (BATCH_SIZE 100) written with ``bulk_create``: their
    commits wake the stream, and the API gets about 60 bulk requests, not 6,000."""
    events, config = 6_000, get_stream("marketing")
    groups_expected = math.ceil(events / config.batch_size)
    assert not Schedule.objects.exists()

    lead = Lead.objects.create(name="Ada", email="ada@example.com")
    activities = ContactActivity.objects.bulk_create(
        (ContactActivity(lead=lead, kind="call", comment=f"#{n}") for n in range(events)),
        batch_size=2_000,
    )
    with transaction.atomic():
        ContactActivityEvent.objects.bulk_create(
            (ContactActivityEvent(activity=activity) for activity in activities),
            batch_size=2_000,
        )
    published = set(ContactActivityEvent.objects.values_list("id", flat=True))
    assert len(published) == events
    # The commit's one wake: on PostgreSQL the wake queued by the transaction's first
    # write (ORM broker), elsewhere a run the commit's wake queued for its claim.
    woken = handoff.WAKE if connection.vendor == "postgresql" else handoff.RUN
    assert queued_funcs() == {woken: 1}

    started = time.monotonic()
    with qcluster(log=tmp_path / "qcluster.log") as cluster:
        wait_until(
            lambda: drained("marketing", ContactActivityEvent),
            timeout=DEADLINE,
            describe=lambda: pipeline_state("marketing", ContactActivityEvent),
            watch=[cluster],
            check=fail_on_queue_failures,
        )
        seconds = time.monotonic() - started
    print(f"\nqcluster drained {events:,} marketing events: {seconds:.1f}s")

    assert queue_failures() == []
    assert log_problems(cluster) == []
    archived = assert_archived_once_done("marketing", published)
    group_sizes = assert_groups_of_one_batch(archived, config.batch_size, config.runs)
    assert groups_expected <= len(group_sizes) <= groups_expected + config.runs
    # The fake API recorded one request per group, each carrying the whole group.
    requests = Counter(ApiRequest.objects.values_list("size", "succeeded"))
    assert requests == Counter((size, True) for size in group_sizes.values())


def test_a_failed_group_is_retried_by_the_cluster_when_its_backoff_ends(tmp_path):
    """Rows the marketing API rejects (a lead without an email address) stay in their
    group, which waits out its backoff; the data is fixed meanwhile, and when the backoff
    ends the retry handed over for then brings the group back: the cluster finishes it on
    attempt 2, with no distribute. The rows' commit started the first run."""
    config = get_stream("marketing")
    good = Lead.objects.create(name="Ada", email="ada@example.com")
    bad = Lead.objects.create(name="Bob", email="")
    # 250 rows, 100 of them (ids 100..199 in creation order) Bob's. Concurrent claims
    # may split them over two or three groups (SKIP LOCKED interleaves): asserted per row.
    activities = ContactActivity.objects.bulk_create(
        ContactActivity(lead=bad if 100 <= n < 200 else good, kind="email") for n in range(250)
    )
    ContactActivityEvent.objects.bulk_create(
        ContactActivityEvent(activity=activity) for activity in activities
    )
    published = set(ContactActivityEvent.objects.values_list("id", flat=True))
    rejected = set(
        ContactActivityEvent.objects.filter(activity__lead=bad).values_list("id", flat=True)
    )
    assert len(rejected) == 100
    assert not Schedule.objects.exists()

    with qcluster(log=tmp_path / "qcluster.log") as cluster:  # bulk_create woke the stream
        # Attempt 1: the good rows are archived, the rejected ones wait in a retrying group.
        wait_until(
            lambda: (
                set(ContactActivityEvent.objects.values_list("id", flat=True)) == rejected
                and OutboxGroup.objects.exists()
                and OutboxGroup.objects.filter(state=GroupState.RETRYING).count()
                == OutboxGroup.objects.count()
                and set(queued_funcs()) == {handoff.RETRY}  # no run queued or running
            ),
            timeout=DEADLINE,
            describe=lambda: pipeline_state("marketing", ContactActivityEvent),
            watch=[cluster],
            check=fail_on_queue_failures,
        )
        retrying = list(OutboxGroup.objects.values("id", "attempt", "size", "row_errors"))
        assert sum(group["size"] for group in retrying) == len(rejected)
        assert {group["attempt"] for group in retrying} == {1}
        errors = {int(pk): err for group in retrying for pk, err in group["row_errors"].items()}
        assert errors == dict.fromkeys(rejected, "lead has no email address")
        first_requests = ApiRequest.objects.count()

        # Each group's retry waits in django-q2's queue, held back until it is due.
        assert queued_funcs() == {handoff.RETRY: len(retrying)}
        assert not OrmQ.objects.filter(lock__lte=timezone.now()).exists()
        Lead.objects.filter(pk=bad.pk).update(email="bob@example.com")
        wait_until(
            lambda: drained("marketing", ContactActivityEvent),
            timeout=config.backoff_seconds + DEADLINE,
            describe=lambda: pipeline_state("marketing", ContactActivityEvent),
            watch=[cluster],
            check=fail_on_queue_failures,
        )

    assert queue_failures() == []
    assert log_problems(cluster) == []
    archived = assert_archived_once_done("marketing", published)
    attempts = {event_id: n for event_id, _, _, n in archived}
    assert {attempts[pk] for pk in rejected} == {2}
    assert {attempts[pk] for pk in published - rejected} == {1}
    # One more request per retried group, carrying only the rows that had failed.
    retried = list(ApiRequest.objects.order_by("id").values_list("size", flat=True))
    assert sorted(retried[first_requests:]) == sorted(group["size"] for group in retrying)
    assert ArchivedEvent.objects.filter(event_id__in=rejected).values(
        "group_id"
    ).distinct().count() == len(retrying)

"""Failure isolation: a group that fails as a whole is split until the poison row is alone."""

from __future__ import annotations

import math

import pytest
from django.db.models.functions import Now
from django.test import override_settings

from django_outbox import publish_many
from django_outbox.conf import get_stream
from django_outbox.exceptions import LeaseLost
from django_outbox.models import ArchivedEvent, GroupState, OutboxEvent, OutboxGroup, Outcome
from django_outbox.streams.attempt import AttemptOutcome, finalize, process_group, take_group_lease
from django_outbox.streams.batch import Batch
from django_outbox.streams.run import claim_group
from django_outbox.transport import handoff
from tests.testapp.models import Attachment, HandledCall

pytestmark = pytest.mark.django_db  # in a test transaction: no wake on commit

ROWS = 64
LAB = {
    "HANDLER": "tests.testapp.handlers.record",
    "BATCH_SIZE": ROWS,
    "MAX_ATTEMPTS": 3,
    "BACKOFF_SECONDS": 1,
}
ISOLATING = override_settings(DJANGO_OUTBOX={"STREAMS": {"lab": LAB}})


def publish_with_poison(*poison_at: int) -> list[int]:
    """Publish ROWS rows to ``lab``, those at *poison_at* poisoned; return their ids."""
    publish_many(
        "lab", [{"n": n, "poison": True} if n in poison_at else {"n": n} for n in range(ROWS)]
    )
    return list(
        OutboxEvent.objects.filter(stream="lab").order_by("id").values_list("id", flat=True)
    )


def due_now() -> None:
    """Let every waiting retry come due, as its backoff passing would."""
    OutboxGroup.objects.filter(state=GroupState.RETRYING).update(next_attempt_at=Now())


def settle(inline, limit: int = 50) -> int:
    """Run the stream until no group is left; return how many backoffs it waited for.

    Each round lets every waiting retry come due (as the backoff passing would), then
    runs distribute, the safety net that re-enqueues due retries.
    """
    inline.drain()
    for waited in range(limit):
        if not OutboxGroup.objects.filter(stream="lab").exists():
            return waited
        OutboxGroup.objects.filter(state=GroupState.RETRYING).update(next_attempt_at=Now())
        inline.distribute("lab")
    raise AssertionError(f"the stream did not settle: {list(OutboxGroup.objects.values())}")


def archived(outcome: str) -> list[int]:
    rows = ArchivedEvent.objects.filter(stream="lab", outcome=outcome)
    return sorted(rows.values_list("event_id", flat=True))


def calls() -> int:
    return HandledCall.objects.filter(stream="lab").count()


@ISOLATING
@pytest.mark.parametrize("poison_at", [0, 37, ROWS - 1])
def test_one_poison_row_is_cornered_and_the_healthy_rows_are_delivered_at_once(
    inline, handler_mode, poison_at
):
    ids = publish_with_poison(poison_at)
    handler_mode("poison")

    inline.distribute("lab")

    # A first failure may be a passing glitch: the group waits for its retry, whole.
    [group] = OutboxGroup.objects.filter(stream="lab")
    assert (group.size, group.state, group.split_depth) == (ROWS, GroupState.RETRYING, 0)
    assert calls() == 1

    due_now()
    inline.distribute("lab")

    # Its second failure splits it; then, with no further backoff, every healthy row is
    # delivered and the poison row waits alone.
    assert archived(Outcome.DONE) == [i for i in ids if i != ids[poison_at]]
    [left] = OutboxGroup.objects.filter(stream="lab")
    assert (left.size, left.state, left.split_depth) == (1, GroupState.RETRYING, math.log2(ROWS))
    assert "poison pill" in left.last_error
    # Two calls of the whole group, then two calls per halving.
    assert calls() == 2 + 2 * int(math.log2(ROWS))

    # The splits spent none of the rows' attempts: the poison row has used 2 of 3.
    assert settle(inline) == LAB["MAX_ATTEMPTS"] - 2
    assert archived(Outcome.FAILED) == [ids[poison_at]]
    dead = ArchivedEvent.objects.get(outcome=Outcome.FAILED)
    assert "poison pill" in dead.error and dead.attempts == LAB["MAX_ATTEMPTS"]
    assert OutboxEvent.objects.count() == 0


@ISOLATING
def test_when_every_call_fails_the_group_is_split_once_and_then_backs_off(inline, handler_mode):
    ids = publish_with_poison()
    handler_mode("raise")  # the service is down: no half is ever delivered

    inline.distribute("lab")
    due_now()
    inline.distribute("lab")

    halves = OutboxGroup.objects.filter(stream="lab").order_by("size")
    assert [(g.size, g.state, g.split_depth) for g in halves] == [
        (ROWS // 2, GroupState.RETRYING, 1),
        (ROWS // 2, GroupState.RETRYING, 1),
    ]
    assert {halves[0].sibling_id, halves[1].sibling_id} == {halves[0].id, halves[1].id}
    assert calls() == 4

    settle(inline)
    # No further halving without evidence: each half used the attempts left (the split
    # spent none), then both were dead-lettered whole, with the error.
    assert calls() == 2 + 2 * (LAB["MAX_ATTEMPTS"] - 1)
    assert archived(Outcome.FAILED) == ids
    assert set(ArchivedEvent.objects.values_list("attempts", flat=True)) == {LAB["MAX_ATTEMPTS"]}


@ISOLATING
def test_a_permanent_failure_splits_at_every_level_and_dead_letters_only_the_poison_row(
    inline, handler_mode
):
    ids = publish_with_poison(5)
    handler_mode("poison-permanent")

    inline.distribute("lab")

    assert not OutboxGroup.objects.exists()
    assert archived(Outcome.FAILED) == [ids[5]]
    assert archived(Outcome.DONE) == [i for i in ids if i != ids[5]]
    dead = ArchivedEvent.objects.get(outcome=Outcome.FAILED)
    assert dead.attempts == 1 and "422 (poison pill)" in dead.error


@ISOLATING
def test_a_half_waiting_for_its_retry_is_split_when_its_sibling_is_delivered(inline, handler_mode):
    ids = publish_with_poison(3)
    with handoff.capture():
        group_id = claim_group("lab").group_id
    handler_mode("poison")
    with handoff.capture():
        assert process_group("lab", group_id) is AttemptOutcome.RETRYING
    OutboxGroup.objects.filter(id=group_id).update(state=GroupState.CLAIMED)  # its retry
    with inline.capturing():
        assert process_group("lab", group_id) is AttemptOutcome.SPLIT
    lower, upper = (job.args[1] for job in inline.jobs)
    inline.jobs.clear()

    with inline.capturing():
        assert process_group("lab", lower) is AttemptOutcome.RETRYING  # sibling not run yet
        assert process_group("lab", upper) is AttemptOutcome.DONE
    # The delivered upper half was the evidence: the lower half is split at once,
    # without waiting for its backoff.
    assert not OutboxGroup.objects.filter(id=lower).exists()
    quarters = OutboxGroup.objects.filter(stream="lab")
    assert sorted(g.size for g in quarters) == [ROWS // 4, ROWS // 4]
    assert {g.state for g in quarters} == {GroupState.CLAIMED}
    assert len(inline.jobs) == 2
    assert archived(Outcome.DONE) == ids[ROWS // 2 :]


@ISOLATING
def test_a_worker_still_holding_the_split_group_changes_nothing(handler_mode):
    publish_with_poison(1)
    config = get_stream("lab")
    with handoff.capture():
        group_id = claim_group("lab").group_id
    stale = Batch(config, group_id, take_group_lease(config, group_id))
    # Its lease expires; the group is queued again and fails as a whole: split.
    OutboxGroup.objects.filter(id=group_id).update(state=GroupState.CLAIMED)
    handler_mode("poison")
    with handoff.capture():
        assert process_group("lab", group_id) is AttemptOutcome.SPLIT

    with pytest.raises(LeaseLost):
        finalize(stale, None)
    assert OutboxEvent.objects.filter(group_id=group_id).count() == 0
    assert OutboxEvent.objects.count() == ROWS  # every row still in one of the halves
    assert ArchivedEvent.objects.count() == 0


@override_settings(DJANGO_OUTBOX={"STREAMS": {"lab": {**LAB, "ISOLATE_FAILURES": False}}})
def test_without_isolation_the_whole_group_is_retried_and_dead_lettered(inline, handler_mode):
    ids = publish_with_poison(9)
    handler_mode("poison")

    inline.distribute("lab")
    settle(inline)

    assert calls() == LAB["MAX_ATTEMPTS"]
    assert archived(Outcome.FAILED) == ids
    assert not OutboxGroup.objects.filter(split_depth__gt=0).exists()


@override_settings(
    DJANGO_OUTBOX={
        "STREAMS": {
            "attachments": {
                "HANDLER": "tests.testapp.handlers.refuse_poison_title",
                "MODEL": "testapp.Attachment",
                "BATCH_SIZE": 8,
            }
        }
    }
)
def test_a_custom_buffer_model_is_split_too(inline):
    titles = ["poison" if n == 6 else f"file {n}" for n in range(8)]
    Attachment.objects.bulk_create([Attachment(title=title) for title in titles])

    inline.distribute("attachments")  # a PermanentFailure splits at once, at every level

    assert not OutboxGroup.objects.filter(stream="attachments").exists()
    assert not Attachment.objects.exists()
    archive = ArchivedEvent.objects.filter(stream="attachments")
    assert archive.filter(outcome=Outcome.DONE).count() == 7
    [dead] = archive.filter(outcome=Outcome.FAILED)
    assert "poison attachment" in dead.error and dead.attempts == 1


@ISOLATING
def test_isolating_groups_show_in_status_metrics_admin_and_signals(
    inline, handler_mode, admin_client, django_capture_on_commit_callbacks
):
    from django_outbox.metrics import render
    from django_outbox.signals import group_split
    from django_outbox.streams.status import stream_status

    splits = []
    group_split.connect(lambda **kw: splits.append(kw), weak=False, dispatch_uid="t-split")
    try:
        publish_with_poison()
        handler_mode("raise")
        with django_capture_on_commit_callbacks(execute=True):  # signals follow the commit
            inline.distribute("lab")
            due_now()
            inline.distribute("lab")  # the second failure splits
    finally:
        group_split.disconnect(dispatch_uid="t-split")

    assert [(s["rows"], s["depth"], s["attempt"]) for s in splits] == [(ROWS, 1, 2)]
    assert "handler exploded" in splits[0]["error"]
    assert stream_status("lab").groups_isolating == 2
    assert b'django_outbox_isolating_groups{stream="lab"} 2.0' in render()[0]
    page = admin_client.get("/admin/django_outbox/outboxgroup/?isolating=yes").content.decode()
    assert page.count('class="field-split_depth">1<') == 2
    none = admin_client.get("/admin/django_outbox/outboxgroup/?isolating=no").content.decode()
    assert 'class="field-split_depth"' not in none

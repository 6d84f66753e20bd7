"""outbox_prune: expired keys, the archive per stream and outcome, finished unique jobs."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from blogs.models import Blog, RebuildBlogFeed
from django.conf import settings
from django.core.management import CommandError, call_command
from django.test import override_settings
from django.utils import timezone

from django_outbox.archive.prune import prune_all
from django_outbox.models import ArchivedEvent, IdempotencyKey, Outcome

pytestmark = pytest.mark.django_db(transaction=True)


def archived(stream: str, outcome: str, days_ago: float, n: int = 1) -> None:
    at = timezone.now() - timedelta(days=days_ago)
    ArchivedEvent.objects.bulk_create(
        ArchivedEvent(
            stream=stream,
            event_id=i,
            data={"id": i},
            created_at=at,
            archived_at=at,
            outcome=outcome,
        )
        for i in range(n)
    )


def key(name: str, expires_in: timedelta | None) -> None:
    IdempotencyKey.objects.create(
        scope="tests",
        key=name,
        completed_at=timezone.now(),
        expires_at=timezone.now() + expires_in if expires_in is not None else None,
    )


def remaining() -> dict:
    return {
        "keys": sorted(IdempotencyKey.objects.values_list("key", flat=True)),
        "archive": sorted(ArchivedEvent.objects.values_list("stream", "outcome").distinct()),
        "archived": ArchivedEvent.objects.count(),
    }


@pytest.fixture
def due():
    """Rows on both sides of every retention (30 days done, 90 days failed by default)."""
    key("expired", timedelta(seconds=-1))
    key("live", timedelta(days=1))
    archived("audit", Outcome.DONE, 31, n=7)
    archived("audit", Outcome.DONE, 29, n=2)
    archived("audit", Outcome.FAILED, 31, n=3)  # a dead letter is kept longer
    archived("audit", Outcome.FAILED, 91, n=4)
    archived("retired", Outcome.DONE, 31, n=5)  # a stream no longer configured


def test_prune_deletes_exactly_what_outlived_its_retention(due):
    out = io.StringIO()
    call_command("outbox_prune", "--batch-size", "2", stdout=out)

    assert IdempotencyKey.objects.filter(key="live").exists()
    assert not IdempotencyKey.objects.filter(key="expired").exists()
    ages = sorted(
        (stream, outcome, (timezone.now() - at).days)
        for stream, outcome, at in ArchivedEvent.objects.values_list(
            "stream", "outcome", "archived_at"
        )
    )
    assert ages == [("audit", "done", 29)] * 2 + [("audit", "failed", 31)] * 3
    text = out.getvalue()
    assert "idempotency keys (expired): deleted 1" in text
    assert "archive audit done (older than 30 days): deleted 7" in text
    assert "archive audit failed (older than 90 days): deleted 4" in text
    assert "archive retired done (older than 30 days): deleted 5" in text
    assert text.endswith("Total: deleted 17 row(s).\n")


def test_dry_run_counts_and_deletes_nothing(due):
    before = remaining()
    out = io.StringIO()

    call_command("outbox_prune", "--dry-run", stdout=out)

    assert remaining() == before
    assert "archive audit done (older than 30 days): would delete 7" in out.getvalue()
    assert out.getvalue().endswith("Total: would delete 17 row(s).\n")


def test_retention_per_stream_overrides_the_global_one(due):
    outbox = dict(settings.DJANGO_OUTBOX)
    outbox["STREAMS"] = {
        **outbox["STREAMS"],
        "audit": {**outbox["STREAMS"]["audit"], "ARCHIVE_RETENTION_DAYS": 60},
    }
    with override_settings(DJANGO_OUTBOX={**outbox, "ARCHIVE_FAILED_RETENTION_DAYS": 10}):
        results = {r.target: r.rows for r in prune_all(streams=["audit"])}

    assert results == {
        "archive audit done (older than 60 days)": 0,
        "archive audit failed (older than 10 days)": 7,
    }


@pytest.mark.parametrize(
    "args",
    [["--batch-size", "0"], ["--batch-size", "lots"], ["--stream", "nope"]],
)
def test_bad_arguments_are_a_command_error_and_delete_nothing(due, args):
    before = remaining()

    with pytest.raises(CommandError):
        call_command("outbox_prune", *args, stdout=io.StringIO())

    assert remaining() == before


def test_finished_unique_jobs_are_pruned_after_their_kind_retention():
    blogs = [Blog.objects.create(name=f"b{n}") for n in range(3)]
    jobs = [RebuildBlogFeed.enqueue(blog=blog)[0] for blog in blogs]
    old = timezone.now() - timedelta(days=8)  # the kind keeps finished jobs 7 days
    RebuildBlogFeed.objects.filter(pk=jobs[0].pk).update(state="processed", finished_at=old)
    RebuildBlogFeed.objects.filter(pk=jobs[1].pk).update(
        state="processed", finished_at=timezone.now()
    )

    results = {r.target: r.rows for r in prune_all()}

    assert results["unique jobs blogs.RebuildBlogFeed (finished, older than 7 days)"] == 1
    assert sorted(RebuildBlogFeed.objects.values_list("pk", flat=True)) == [
        jobs[1].pk,
        jobs[2].pk,
    ]


def test_the_scheduled_task_prunes_everything():
    from django_outbox.tasks import prune

    key("expired", timedelta(seconds=-1))
    archived("audit", Outcome.DONE, 31)

    results = {r["target"]: r["rows"] for r in prune()}

    assert results["idempotency keys (expired)"] == 1
    assert results["archive audit done (older than 30 days)"] == 1

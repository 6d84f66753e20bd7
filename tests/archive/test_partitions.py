"""The partitioned archive: PartitionArchive converts it, prune drops whole partitions.

The PostgreSQL tests apply the operation to the test database's archive table with a
schema editor, as ``migrate`` would from a project's migration, and revert it after.
"""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta

import pytest
from django.core.checks import run_checks
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test import override_settings
from django.urls import reverse
from django.utils import timezone

from django_outbox import publish_many
from django_outbox.archive.partitions import archive_partitioning
from django_outbox.archive.prune import prune_all
from django_outbox.archive.replay import replay_failed
from django_outbox.archive.sql import partitions as sql
from django_outbox.models import ArchivedEvent, OutboxEvent, Outcome
from django_outbox.operations import PartitionArchive
from tests.docs_examples.partition_archive import Migration

TABLE = ArchivedEvent._meta.db_table


def test_an_interval_is_a_whole_number_of_hours_days_or_weeks():
    assert sql.parse_interval("1 day") == timedelta(days=1)
    assert sql.parse_interval("6 hours") == timedelta(hours=6)
    assert sql.parse_interval("2 Weeks") == timedelta(weeks=2)
    for bad in ("1 month", "0 days", "day", "1.5 days", 1, None):
        with pytest.raises(ValueError, match="not a partition interval"):
            PartitionArchive(interval=bad)
    assert PartitionArchive(interval="6 hours").deconstruct() == (
        "PartitionArchive",
        [],
        {"interval": "6 hours"},
    )


def test_intervals_are_aligned_on_the_epoch():
    moment = datetime(2026, 11, 26, 13, 45, tzinfo=UTC)
    assert sql.interval_start(moment, timedelta(days=1)) == datetime(2026, 11, 26, tzinfo=UTC)
    assert sql.interval_start(moment, timedelta(hours=6)) == datetime(2026, 11, 26, 12, tzinfo=UTC)


@pytest.mark.django_db(transaction=True)
def test_elsewhere_the_operation_changes_nothing_and_retention_deletes(vendor):
    if vendor == "postgresql":
        pytest.skip("the SQLite tier's test")
    archived("audit", Outcome.DONE, ago(31), n=2)
    with connection.schema_editor() as editor:
        apply(editor, forwards=True)
    assert archive_partitioning() is None
    assert run_checks(databases=["default"], tags=["database"]) == []
    assert {r.target: r.rows for r in prune_all()}["archive audit done (older than 30 days)"] == 2


def state():
    return MigrationExecutor(connection).loader.project_state()


def apply(editor, *, forwards: bool, interval: str = "1 day") -> None:
    """Apply the documented migration's operation (another interval: one like it)."""
    [operation] = Migration.operations
    if interval != operation.interval:
        operation = PartitionArchive(interval=interval)
    project = state()
    if forwards:
        operation.database_forwards("app", editor, project, project)
    else:
        operation.database_backwards("app", editor, project, project)


@pytest.fixture
def partitioned():
    """The archive partitioned by day (with the rows the test put there before), reverted after."""

    def convert(interval: str = "1 day") -> None:
        with connection.schema_editor() as editor:
            apply(editor, forwards=True, interval=interval)

    yield convert
    if sql.is_partitioned(connection, TABLE):
        with connection.schema_editor() as editor:
            apply(editor, forwards=False)


def archived(stream: str, outcome: str, at: datetime, n: int = 1) -> list[int]:
    rows = ArchivedEvent.objects.bulk_create(
        ArchivedEvent(
            stream=stream, event_id=i, data={"i": i}, created_at=at, archived_at=at, outcome=outcome
        )
        for i in range(n)
    )
    return [row.pk for row in rows]


def ago(days: float) -> datetime:
    return timezone.now() - timedelta(days=days)


def backfill(days: int) -> None:
    """Create the daily partitions of the last *days* days (as if the archive had been
    partitioned that long)."""
    state = archive_partitioning()
    _, statements = sql.ensure_statements(
        connection, TABLE, state.interval, ago(days), timezone.now(), state.partitions
    )
    sql.execute(connection, statements)


def leaves() -> list[str]:
    return [p.name for p in archive_partitioning().partitions]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_converting_keeps_every_row_and_id_and_reverting_restores_the_plain_table(partitioned):
    done = archived("audit", Outcome.DONE, ago(40), n=3) + archived("audit", Outcome.DONE, ago(1))
    failed = archived("audit", Outcome.FAILED, ago(100), n=2)
    before = sorted(ArchivedEvent.objects.values_list("pk", "outcome", "archived_at"))

    partitioned()

    state = archive_partitioning()
    assert state.interval == timedelta(days=1)
    assert sorted(ArchivedEvent.objects.values_list("pk", "outcome", "archived_at")) == before
    names = leaves()
    assert f"{TABLE}_done_legacy" in names and f"{TABLE}_failed_legacy" in names
    now = timezone.now()
    for outcome in ("done", "failed"):
        assert state.covering(outcome, now) is not None  # the legacy partitions hold today
        assert state.covering(outcome, now + timedelta(days=1)) is not None  # and ahead
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {TABLE}_failed_legacy")
        assert cursor.fetchone()[0] == len(failed)
    [new] = archived("audit", Outcome.DONE, timezone.now())
    assert new > max(done + failed)
    assert ArchivedEvent.objects.get(pk=done[0]).outcome == Outcome.DONE

    with connection.schema_editor() as editor:
        apply(editor, forwards=False)

    assert archive_partitioning() is None
    assert ArchivedEvent.objects.count() == len(done) + len(failed) + 1
    [newer] = archived("audit", Outcome.FAILED, timezone.now())
    assert newer > new
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
            "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s::regclass AND i.indisprimary",
            [TABLE],
        )
        assert [row[0] for row in cursor.fetchall()] == ["id"]
        cursor.execute("SELECT indexname FROM pg_indexes WHERE tablename = %s", [TABLE])
        assert "outbox_archive_outcome_at" in {row[0] for row in cursor.fetchall()}


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_prune_drops_the_partitions_entirely_past_retention_and_keeps_the_rest(partitioned):
    partitioned()  # an empty archive: no legacy partitions
    assert not [p for p in archive_partitioning().partitions if p.is_legacy]
    backfill(100)
    archived("audit", Outcome.DONE, ago(45), n=4)
    archived("audit", Outcome.DONE, ago(29), n=2)  # within 30 days
    archived("audit", Outcome.FAILED, ago(45), n=3)  # dead letters: 90 days
    archived("audit", Outcome.FAILED, ago(95), n=1)
    old_done = archive_partitioning().covering("done", ago(45)).name

    out = io.StringIO()
    call_command("outbox_prune", stdout=out)

    left = sorted(
        (outcome, round((timezone.now() - at) / timedelta(days=1)))
        for outcome, at in ArchivedEvent.objects.values_list("outcome", "archived_at")
    )
    assert left == [("done", 29)] * 2 + [("failed", 45)] * 3
    state = archive_partitioning()
    assert old_done not in leaves()
    cutoff = {"done": ago(30), "failed": ago(90)}
    for partition in state.partitions:
        # Kept: every partition that reaches into the retention, the straddling one too.
        assert partition.upper > cutoff[partition.outcome]
    assert state.covering("done", ago(30)) is not None
    assert "archive partitions done (" in out.getvalue()
    assert "archive audit done" not in out.getvalue()  # no row-by-row delete


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_legacy_partition_is_pruned_row_by_row_until_it_is_dropped(partitioned):
    archived("audit", Outcome.DONE, ago(45), n=3)
    archived("audit", Outcome.DONE, ago(10), n=2)
    archived("audit", Outcome.FAILED, ago(95), n=2)
    archived("audit", Outcome.FAILED, ago(10), n=1)
    partitioned()

    prune_all()

    assert sorted(ArchivedEvent.objects.values_list("outcome", flat=True)) == [
        "done",
        "done",
        "failed",
    ]
    assert f"{TABLE}_done_legacy" in leaves()  # it still holds rows inside retention


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_shorter_retention_of_one_stream_is_still_deleted_row_by_row(partitioned):
    partitioned()
    backfill(40)
    archived("audit", Outcome.DONE, ago(20), n=2)
    archived("short", Outcome.DONE, ago(20), n=3)
    archived("short", Outcome.DONE, ago(5), n=1)
    streams = {
        "audit": {"HANDLER": "tests.testapp.handlers.record"},
        "short": {"HANDLER": "tests.testapp.handlers.record", "ARCHIVE_RETENTION_DAYS": 7},
    }
    with override_settings(DJANGO_OUTBOX={"STREAMS": streams}):
        results = {r.target: r.rows for r in prune_all()}

    assert results["archive short done (older than 7 days)"] == 3
    assert sorted(ArchivedEvent.objects.values_list("stream", flat=True)) == ["audit"] * 2 + [
        "short"
    ]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_prune_creates_partitions_ahead_and_the_checks_see_them(partitioned):
    partitioned()
    assert run_checks(databases=["default"], tags=["database"]) == []
    today = archive_partitioning().covering("done", timezone.now())
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {TABLE}_done DETACH PARTITION {today.name}")
        cursor.execute(f"DROP TABLE {today.name}")

    messages = run_checks(databases=["default"], tags=["database"])
    assert [m.id for m in messages] == ["django_outbox.E091"]
    assert "no partition for done rows" in messages[0].msg
    assert "outbox_prune" in messages[0].hint

    prune_all()
    assert run_checks(databases=["default"], tags=["database"]) == []
    assert today.name in leaves()

    with connection.cursor() as cursor:
        cursor.execute(f"COMMENT ON TABLE {TABLE} IS 'hand-edited'")
    [message] = run_checks(databases=["default"], tags=["database"])
    assert message.id == "django_outbox.E090"


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_partitions_that_end_before_the_next_prune_run_are_a_warning(partitioned):
    partitioned(interval="1 hour")
    state = archive_partitioning()
    with connection.cursor() as cursor:
        for partition in state.partitions:
            if partition.lower > timezone.now() + timedelta(hours=2):
                cursor.execute(
                    f"ALTER TABLE {TABLE}_{partition.outcome} DETACH PARTITION {partition.name}"
                )
                cursor.execute(f"DROP TABLE {partition.name}")

    assert (
        sorted(m.id for m in run_checks(databases=["default"], tags=["database"]))
        == ["django_outbox.W004"] * 2
    )


STREAMS = {
    "audit": {
        "HANDLER": "tests.testapp.handlers.record",
        "BATCH_SIZE": 10,
        "MAX_ATTEMPTS": 1,
        "ISOLATE_FAILURES": False,
    },
}


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@override_settings(DJANGO_OUTBOX={"STREAMS": STREAMS})
def test_archiving_replay_admin_and_metrics_work_on_a_partitioned_archive(
    partitioned, handler_mode, inline, admin_client
):
    partitioned()
    handler_mode("permanent")
    with inline.capturing():
        publish_many("audit", [{"n": i} for i in range(3)])
    inline.drain()  # one attempt: three dead letters
    handler_mode("ok")
    with inline.capturing():
        publish_many("audit", [{"n": "ok"}])
    inline.drain()
    assert (
        sorted(ArchivedEvent.objects.values_list("outcome", flat=True)) == ["done"] + ["failed"] * 3
    )

    letter = ArchivedEvent.objects.filter(outcome="failed").first()
    changelist = reverse("admin:django_outbox_archivedevent_changelist")
    assert admin_client.get(changelist).status_code == 200
    page = admin_client.get(reverse("admin:django_outbox_archivedevent_change", args=[letter.pk]))
    assert page.status_code == 200 and str(letter.event_id) in page.content.decode()

    assert replay_failed(ArchivedEvent.objects.filter(outcome="failed")) == {"audit": 3}
    assert ArchivedEvent.objects.filter(replayed_at__isnull=False).count() == 3
    assert OutboxEvent.objects.filter(stream="audit").count() == 3

    scrape = admin_client.get("/outbox/metrics").content.decode()
    assert 'django_outbox_archived_last_hour_rows{outcome="failed",stream="audit"} 3.0' in scrape

    assert ArchivedEvent.objects.filter(pk=letter.pk).delete()[0] == 1  # by id alone

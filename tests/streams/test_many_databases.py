"""Streams on many databases: each stream's rows, groups, state and archive on its own.

A stream lives on its ``DATABASE`` (or where the router sends its buffer model); the
pipeline, the status, the admin and the checks follow it there. Both tiers: the second
database (``other``, see tests/settings.py) is created only for the tests here.
"""

from __future__ import annotations

import io
import json
from datetime import timedelta
from typing import Any
from unittest import mock

import pytest
from django.conf import settings
from django.core.checks import run_checks
from django.core.management import call_command
from django.db import OperationalError, connections, transaction
from django.db.migrations.recorder import MigrationRecorder
from django.db.models.functions import Now
from django.test import override_settings
from django.urls import reverse
from django.utils.timezone import now

from django_outbox import publish, publish_many
from django_outbox.admin import throughput
from django_outbox.archive import tune as tune_module
from django_outbox.archive.partitions import archive_partitioning
from django_outbox.archive.prune import prune_all
from django_outbox.archive.replay import dead_letters, replay_failed
from django_outbox.archive.sql import partitions as sql
from django_outbox.archive.tune import CHURN_PARAMETERS
from django_outbox.checks import unapplied_migrations
from django_outbox.conf import get_stream, stream_database, stream_databases
from django_outbox.jobs.staging import drain_until_empty, stage_task, staging_databases
from django_outbox.models import (
    ArchivedEvent,
    HeldKey,
    OutboxEvent,
    OutboxGroup,
    Outcome,
    StagedJob,
    StreamState,
)
from django_outbox.streams.batch import Batch
from django_outbox.streams.distribute import distribute_stream
from django_outbox.streams.inline import run_inline
from django_outbox.streams.status import all_statuses
from django_outbox.streams.steer import release_keys, set_paused
from django_outbox.transport import handoff
from tests.archive.test_partitions import (  # noqa: F401
    TABLE,
    ago,
    apply,
    archived,
    backfill,
    partitioned,
)
from tests.conftest import InlineRunner, unwoken
from tests.docs_examples import many_databases
from tests.test_metrics import samples
from tests.testapp.models import Attachment, HandledCall, JobEffect, OrderedEvent

BOTH = ["default", "other"]
pytestmark = pytest.mark.django_db(transaction=True, databases=BOTH)

HANDLER = "tests.testapp.handlers.record"


def record_ids(batch: Batch) -> None:
    """A handler for buffers without a payload: record the ids it saw."""
    HandledCall.objects.create(
        stream=batch.stream,
        group_id=batch.group_id,
        attempt=batch.attempt,
        event_ids=[row["id"] for row in batch.rows("id")],
    )


def two_streams(**remote: Any) -> dict[str, Any]:
    """``audit`` on the default database, ``remote`` on ``other``."""
    return {
        "STAGING": settings.DJANGO_OUTBOX["STAGING"],
        "STREAMS": {
            "audit": {"HANDLER": HANDLER, "BATCH_SIZE": 10},
            "remote": {"HANDLER": HANDLER, "BATCH_SIZE": 10, "DATABASE": "other", **remote},
        },
    }


class AttachmentsOnOther:
    """A router that sends the ``Attachment`` buffer to ``other``."""

    def db_for_write(self, model: Any, **hints: Any) -> str | None:
        return "other" if model is Attachment else None

    db_for_read = db_for_write


def handled_ids(stream: str) -> list[int]:
    calls = HandledCall.objects.filter(stream=stream)
    return sorted(i for call in calls for i in call.event_ids)


def on(alias: str, model: Any, **lookups: Any) -> int:
    return model.objects.using(alias).filter(**lookups).count()


@override_settings(DJANGO_OUTBOX=two_streams())
def test_each_stream_is_delivered_from_its_own_database_with_its_groups_state_and_archive():
    runner = InlineRunner()
    with runner.capturing():
        with transaction.atomic(using="other"):
            remote = [publish("remote", {"n": n}) for n in range(25)]
        with transaction.atomic():
            audit = [publish("audit", {"n": n}) for n in range(5)]
    assert on("other", OutboxEvent, stream="remote") == 25
    assert on("default", OutboxEvent, stream="remote") == 0
    runner.drain()

    assert handled_ids("remote") == sorted(remote)
    assert handled_ids("audit") == sorted(audit)
    assert on("other", ArchivedEvent, stream="remote", outcome="done") == 25
    assert on("default", ArchivedEvent, stream="remote") == 0
    assert on("default", ArchivedEvent, stream="audit", outcome="done") == 5
    assert on("other", ArchivedEvent, stream="audit") == 0
    assert on("other", OutboxEvent) == on("default", OutboxEvent) == 0
    assert on("other", OutboxGroup) == on("default", OutboxGroup) == 0
    assert on("other", StreamState, stream="remote") == 1
    assert on("default", StreamState, stream="remote") == 0
    assert on("other", StreamState, stream="audit") == 0


@override_settings(DJANGO_OUTBOX=two_streams())
def test_publish_many_a_failed_group_and_distribute_stay_on_the_streams_database(handler_mode):
    handler_mode("raise")
    runner = InlineRunner()
    with runner.capturing():
        assert publish_many("remote", [{"n": n} for n in range(3)]) == 3
    runner.drain()
    [group] = OutboxGroup.objects.using("other").all()
    assert group.state == "retrying"
    assert on("default", OutboxGroup) == 0

    handler_mode("ok")
    OutboxGroup.objects.using("other").update(next_attempt_at=Now())  # due now
    with runner.capturing():
        result = distribute_stream("remote")
    assert result.groups_enqueued == 1
    runner.drain()
    assert on("other", ArchivedEvent, stream="remote", outcome="done") == 3
    assert on("other", OutboxGroup) == 0


@override_settings(DJANGO_OUTBOX=two_streams())
def test_pausing_a_stream_writes_its_state_on_its_database():
    set_paused("remote", True)
    assert StreamState.objects.using("other").get(stream="remote").paused
    assert not StreamState.objects.using("default").filter(stream="remote").exists()
    runner = InlineRunner()
    with runner.capturing():
        publish("remote", {"n": 1})
    assert runner.drain() == []  # paused: the wake starts nothing
    assert on("other", OutboxEvent, stream="remote") == 1


@override_settings(
    DATABASE_ROUTERS=[f"{__name__}.AttachmentsOnOther"],
    DJANGO_OUTBOX={
        "STREAMS": {
            "files": {"HANDLER": f"{__name__}.record_ids", "MODEL": "testapp.Attachment"},
        }
    },
)
def test_a_stream_lives_where_the_router_sends_its_buffer_model():
    assert get_stream("files").alias == "other"
    runner = InlineRunner()
    with runner.capturing():
        created = Attachment.objects.bulk_create(
            [Attachment(title=f"t{n}", content=b"x") for n in range(4)]
        )
    assert on("other", Attachment) == 4
    runner.drain()
    assert handled_ids("files") == sorted(row.id for row in created)
    assert on("other", ArchivedEvent, stream="files", outcome="done") == 4
    assert on("default", ArchivedEvent) == 0
    assert on("other", StreamState, stream="files") == 1


@override_settings(DJANGO_OUTBOX=two_streams())
def test_status_reads_each_stream_on_its_database():
    with unwoken():
        publish_many("remote", [{"n": n} for n in range(7)])
        publish_many("audit", [{"n": n} for n in range(2)])
    backlog = {status.stream: status.backlog for status in all_statuses()}
    assert backlog == {"audit": 2, "remote": 7}
    assert stream_databases() == {"default": ["audit"], "other": ["remote"]}


@override_settings(DJANGO_OUTBOX=two_streams())
def test_the_admin_lists_the_rows_of_the_chosen_database(admin_client):
    ArchivedEvent.objects.using("other").create(
        stream="remote", event_id=1, data={}, outcome="failed", attempts=1, created_at=now()
    )
    url = reverse("admin:django_outbox_archivedevent_changelist")
    assert admin_client.get(url).context["cl"].result_count == 0  # the router's database
    page = admin_client.get(url, {"database": "other"})
    assert page.status_code == 200
    assert page.context["cl"].result_count == 1
    [row] = page.context["cl"].result_list
    detail = admin_client.get(
        reverse("admin:django_outbox_archivedevent_change", args=[row.pk]),
        {"_changelist_filters": "database=other"},
    )
    assert detail.status_code == 200
    state = admin_client.get(
        reverse("admin:django_outbox_streamstate_changelist"), {"database": "other"}
    )
    assert state.status_code == 200
    with unwoken():
        publish_many("remote", [{"n": n} for n in range(2)])
    events = reverse("admin:django_outbox_outboxevent_changelist")
    assert admin_client.get(events).context["cl"].result_count == 0
    assert admin_client.get(events, {"database": "other"}).context["cl"].result_count == 2


def _messages(**settings: Any) -> list[tuple[str, str]]:
    return [(m.id, m.msg) for m in run_checks(**settings) if m.id.startswith("django_outbox")]


@override_settings(DJANGO_OUTBOX=two_streams(DATABASE="elsewhere"))
def test_a_database_that_settings_do_not_define_is_e025():
    assert (
        "django_outbox.E025",
        "DJANGO_OUTBOX['STREAMS']['remote']['DATABASE'] must name "
        "a database of settings.DATABASES, not 'elsewhere'.",
    ) in _messages()


@override_settings(DJANGO_OUTBOX=two_streams())
def test_a_stream_database_without_the_librarys_migrations_is_w005():
    assert _messages(databases=BOTH, tags=["database"]) == []
    assert unapplied_migrations(connections["other"]) == []
    recorder = MigrationRecorder(connections["other"])
    # The one migration, and the development ones it replaces, recorded as applied.
    applied = [name for app, name in recorder.applied_migrations() if app == "django_outbox"]
    for name in applied:
        recorder.record_unapplied("django_outbox", name)
    try:
        [(check, message)] = _messages(databases=BOTH, tags=["database"])
        assert check == "django_outbox.W006"
        assert "'other' holds streams remote" in message and "0001_initial" in message
        # Only the databases a check is asked about are read (migrate --database X).
        assert _messages(databases=["default"], tags=["database"]) == []
    finally:
        for name in applied:
            recorder.record_applied("django_outbox", name)


# Staged jobs commit with the write they belong to, on its database --------------------


def test_a_job_staged_on_another_database_commits_there_and_runs_once():
    """The broker's queue is on ``default``: the job is handed over after the commit on
    ``other`` and its row kept there until the job ran (at least once, run once)."""
    sent: list[handoff.Job] = []
    with mock.patch.object(handoff, "_send", sent.extend):
        with transaction.atomic(using="other"):
            staged = stage_task("tests.testapp.jobs.record", "other-db", using="other")
            assert StagedJob.objects.using("other").filter(id=staged).exists()
            assert not StagedJob.objects.using("default").exists()
        with pytest.raises(RuntimeError), transaction.atomic(using="other"):
            stage_task("tests.testapp.jobs.record", "rolled-back", using="other")
            raise RuntimeError("the write fails")
    [job] = sent
    assert StagedJob.objects.using("other").filter(id=staged).exists()  # kept till it ran
    job.run()
    job.run()  # delivered twice (a broker that can redeliver)
    assert list(JobEffect.objects.values_list("label", flat=True)) == ["other-db"]
    assert not StagedJob.objects.using("other").exists()


@override_settings(DJANGO_OUTBOX=two_streams())
def test_the_drainer_forwards_staged_jobs_of_every_stream_database():
    assert staging_databases() == ["default", "other"]
    with transaction.atomic(using="other"):
        stage_task("tests.testapp.jobs.record", "later", run_after=timedelta(0), using="other")
    runner = InlineRunner()
    with runner.capturing():
        report = drain_until_empty()
    assert report.forwarded == 1 and report.empty
    runner.drain()
    assert list(JobEffect.objects.values_list("label", flat=True)) == ["later"]
    assert not StagedJob.objects.using("other").exists()


def test_the_guides_sharded_application_delivers_each_shards_orders_from_its_shard():
    """docs/how-to/many-databases.md, with the test databases as the shards."""
    many_databases.SENT.clear()
    shards = ["default", "other"]
    with override_settings(
        DATABASE_ROUTERS=["tests.docs_examples.many_databases.ShardRouter"],
        DJANGO_OUTBOX={"STREAMS": many_databases.shard_streams(shards)},
    ):
        assert _messages() == []
        assert _messages(databases=shards, tags=["database"]) == []
        runner = InlineRunner()
        with runner.capturing():
            many_databases.place_order("default", {"order": 1})
            many_databases.place_order("other", {"order": 2})
        assert on("other", OutboxEvent, stream="orders-other") == 1
        runner.drain()
    assert many_databases.SENT == {"orders-default": [{"order": 1}], "orders-other": [{"order": 2}]}
    assert on("other", ArchivedEvent, stream="orders-other") == 1
    assert on("default", ArchivedEvent, stream="orders-other") == 0


@override_settings(DJANGO_OUTBOX=two_streams())
def test_a_scrape_of_the_metrics_reads_every_stream_database(admin_client):
    runner = InlineRunner()
    with runner.capturing():
        publish_many("remote", [{"n": n} for n in range(12)])
    runner.drain()  # 12 archived on other
    with unwoken():
        publish_many("remote", [{"n": n} for n in range(3)])
    with transaction.atomic(using="other"), mock.patch.object(handoff, "_send"):
        stage_task(
            "tests.testapp.jobs.record", "waiting", run_after=timedelta(hours=1), using="other"
        )
    assert on("other", OutboxEvent) == 3 and on("other", StagedJob) == 1
    assert on("default", OutboxEvent) == on("default", StagedJob) == 0
    values = samples(admin_client.get("/outbox/metrics").content)
    assert values[("django_outbox_backlog_rows", (("stream", "remote"),))] == 3
    done = ("django_outbox_archived_last_hour_rows", (("outcome", "done"), ("stream", "remote")))
    assert values[done] == 12
    assert values[("django_outbox_staged_jobs", (("state", "waiting"),))] == 1


@override_settings(DJANGO_OUTBOX=two_streams())
def test_outbox_run_drains_streams_of_both_databases(handler_mode):
    with unwoken():
        publish_many("remote", [{"n": n} for n in range(15)])
        publish_many("audit", [{"n": n} for n in range(5)])
    report = run_inline(until_empty=True, max_wait_seconds=10)
    assert report.stopped_because == "empty"
    assert on("other", ArchivedEvent, stream="remote", outcome="done") == 15
    assert on("default", ArchivedEvent, stream="audit", outcome="done") == 5


@override_settings(DJANGO_OUTBOX=two_streams())
def test_a_stream_database_that_does_not_answer_is_w006():
    with mock.patch(
        "django_outbox.checks.unapplied_migrations", side_effect=OperationalError("refused\n")
    ):
        messages = _messages(databases=["other"], tags=["database"])
    assert messages == [
        (
            "django_outbox.W007",
            "Could not read the migrations of database 'other' (streams remote): refused",
        )
    ]


@override_settings(
    DJANGO_OUTBOX={
        "STREAMS": {
            "files": {"HANDLER": f"{__name__}.record_ids", "MODEL": "testapp.Attachment"},
            "files-other": {
                "HANDLER": f"{__name__}.record_ids",
                "MODEL": "testapp.Attachment",
                "DATABASE": "other",
            },
        }
    }
)
def test_streams_on_two_databases_share_a_buffer_model_each_with_its_own_rows():
    runner = InlineRunner()
    with runner.capturing():
        here = Attachment.objects.create(title="here", content=b"x")
        there = Attachment.objects.using("other").bulk_create(
            [Attachment(title=f"there {n}", content=b"x") for n in range(3)]
        )
    assert sorted(job.args[0] for job in runner.jobs) == ["files", "files-other"]
    runner.drain()
    assert handled_ids("files") == [here.id]
    assert handled_ids("files-other") == sorted(row.id for row in there)
    assert on("other", ArchivedEvent, stream="files-other") == 3
    assert on("default", ArchivedEvent, stream="files") == 1
    assert on("default", Attachment) == on("other", Attachment) == 0


@override_settings(DJANGO_OUTBOX=two_streams())
def test_inside_a_streams_work_only_its_own_tables_move_to_its_database():
    """A handler of ``remote`` (on ``other``) that writes rows of another buffer writes
    them where the router sends that model, and publishes to each stream's database."""
    with stream_database("remote"):
        Attachment.objects.create(title="routed", content=b"x")
        publish("audit", {"from": "remote's handler"})
        assert StreamState.objects.all().db == "other"
    assert on("default", Attachment) == 1 and on("other", Attachment) == 0
    assert on("default", OutboxEvent, stream="audit") == 1


@override_settings(DJANGO_OUTBOX=two_streams())
def test_dead_letters_are_replayed_and_pruned_on_their_streams_database(handler_mode):
    handler_mode("permanent")
    runner = InlineRunner()
    with runner.capturing():
        publish_many("remote", [{"n": n} for n in range(4)])
    runner.drain()
    assert on("other", ArchivedEvent, stream="remote", outcome="failed") == 4

    handler_mode("ok")
    with runner.capturing():
        assert replay_failed(dead_letters(stream="remote")) == {"remote": 4}
    assert on("other", OutboxEvent, stream="remote") == 4
    assert on("default", OutboxEvent) == 0
    runner.drain()
    assert on("other", ArchivedEvent, stream="remote", outcome="done") == 4

    ArchivedEvent.objects.using("other").update(archived_at=now() - timedelta(days=400))
    results = {result.target: result.rows for result in prune_all()}
    assert results["archive remote done (older than 30 days)"] == 4
    assert results["archive remote failed (older than 90 days)"] == 4
    assert on("other", ArchivedEvent) == 0


@override_settings(DJANGO_OUTBOX=two_streams())
def test_the_dashboard_counts_each_stream_on_its_database(admin_client):
    runner = InlineRunner()
    with runner.capturing():
        publish_many("remote", [{"n": n} for n in range(6)])
    runner.drain()
    page = admin_client.get(reverse("admin:django_outbox_dashboard"))
    assert page.status_code == 200
    [remote] = [s for s in page.context["streams"] if s["status"].stream == "remote"]
    assert remote["done_last_hour"] == 6
    assert (
        sum(n for (_, outcome), n in throughput(now())["remote"].items() if outcome == "done") == 6
    )


@pytest.mark.postgres
@override_settings(DJANGO_OUTBOX=two_streams())
def test_a_partitioned_archive_on_one_database_leaves_the_others_pruned_row_by_row(
    partitioned,  # noqa: F811 (the fixture of tests/archive/test_partitions.py)
):
    partitioned()  # the default database's archive, by day
    backfill(100)
    archived("audit", Outcome.DONE, ago(45), n=2)
    ArchivedEvent.objects.using("other").bulk_create(
        ArchivedEvent(
            stream="remote",
            event_id=i,
            data={},
            created_at=ago(45),
            archived_at=ago(45),
            outcome=Outcome.DONE,
        )
        for i in range(3)
    )
    results = {result.target: result.rows for result in prune_all()}
    assert results["archive remote done (older than 30 days)"] == 3
    assert "archive audit done (older than 30 days)" not in results  # whole partitions
    assert on("other", ArchivedEvent) == 0
    assert on("default", ArchivedEvent) == 0


@pytest.fixture
def other_partitioned() -> Any:
    """The ``other`` database's archive partitioned by day, reverted after."""
    with connections["other"].schema_editor() as editor:
        apply(editor, forwards=True)
    yield
    if sql.is_partitioned(connections["other"], ArchivedEvent._meta.db_table):
        with connections["other"].schema_editor() as editor:
            apply(editor, forwards=False)


@pytest.mark.postgres
@override_settings(DJANGO_OUTBOX=two_streams())
def test_the_partition_checks_read_the_archive_of_every_stream_database(other_partitioned):
    assert _messages(databases=BOTH, tags=["database"]) == []
    with stream_database("remote"):
        today = archive_partitioning().covering("done", now())
    with connections["other"].cursor() as cursor:
        cursor.execute(f"ALTER TABLE {TABLE}_done DETACH PARTITION {today.name}")
        cursor.execute(f"DROP TABLE {today.name}")

    assert _messages(databases=BOTH, tags=["database"]) == [
        (
            "django_outbox.E091",
            "The partitioned archive of database 'other' has no partition for done rows "
            "archived now: finalizing a group of its streams fails (their rows stay in the "
            "buffer) until one exists.",
        )
    ]
    assert _messages(databases=["default"], tags=["database"]) == []  # migrate --database

    prune_all()  # creates the partitions ahead on every stream database
    assert _messages(databases=BOTH, tags=["database"]) == []
    with connections["other"].cursor() as cursor:
        cursor.execute(f"COMMENT ON TABLE {TABLE} IS 'hand-edited'")
    [(check, message)] = _messages(databases=BOTH, tags=["database"])
    assert check == "django_outbox.E090"
    assert message.startswith("The partitioned archive of database 'other' records no valid")


def tune(*args: str) -> str:
    out = io.StringIO()
    call_command("outbox_tune", *args, stdout=out)
    return out.getvalue()


@pytest.fixture
def untuned() -> Any:
    """Reset, after the test, the autovacuum parameters outbox_tune --apply sets."""
    yield
    names = ", ".join(CHURN_PARAMETERS)
    for alias in BOTH:
        with connections[alias].cursor() as cursor:
            for table in ("django_outbox_outboxevent", "django_outbox_outboxgroup"):
                cursor.execute(f"ALTER TABLE {table} RESET ({names})")


@pytest.mark.postgres
@override_settings(DJANGO_OUTBOX=two_streams())
def test_outbox_tune_reports_the_tables_and_server_of_every_stream_database(untuned):
    data = json.loads(tune("--json", "--explain"))
    assert [server["database"] for server in data["servers"]] == BOTH
    tables = {(t["database"], t["table"]): t["role"] for t in data["tables"]}
    assert tables[("default", "django_outbox_outboxevent")] == "buffer of audit"
    assert tables[("other", "django_outbox_outboxevent")] == "buffer of remote"
    for table in ("outboxgroup", "streamstate", "archivedevent", "stagedjob"):
        assert ("default", f"django_outbox_{table}") in tables
        assert ("other", f"django_outbox_{table}") in tables
    assert ("other", "django_outbox_idempotencykey") not in tables  # the router's only
    assert {(p["stream"], p["database"]) for p in data["plans"]} == {
        ("audit", "default"),
        ("remote", "other"),
    }

    out = tune()
    assert "database other: autovacuum " in out
    assert [line.split()[:2] for line in out.splitlines() if "buffer of remote" in line] == [
        ["other", "django_outbox_outboxevent"]
    ]

    only = tune("--database", "other", "--explain", "--apply")
    assert "django_outbox_outboxevent on database 'other': set " in only
    assert "database 'default'" not in only and "database default:" not in only
    assert "-- remote: claim (database other)" in only and "-- audit:" not in only
    [buffer] = [r for r in tune_module.report() if r.role == "buffer of remote"]
    assert buffer.database == "other" and buffer.missing == {}
    [buffer] = [r for r in tune_module.report() if r.role == "buffer of audit"]
    assert buffer.database == "default" and buffer.missing != {}


@override_settings(DJANGO_OUTBOX=two_streams())
def test_outbox_replay_replays_the_dead_letters_of_every_stream_database(handler_mode):
    handler_mode("permanent")
    runner = InlineRunner()
    with runner.capturing():
        publish_many("remote", [{"n": n} for n in range(3)])
        publish_many("audit", [{"n": n} for n in range(2)])
    runner.drain()
    out = io.StringIO()
    call_command("outbox_replay", "--dry-run", stdout=out)
    assert out.getvalue().splitlines() == [
        "Would replay 2 row(s) of stream audit.",
        "Would replay 3 row(s) of stream remote.",
    ]
    with runner.capturing():
        call_command("outbox_replay", stdout=io.StringIO())
    assert on("other", OutboxEvent, stream="remote") == 3
    assert on("default", OutboxEvent, stream="audit") == 2


@override_settings(
    DJANGO_OUTBOX={
        "STREAMS": {
            "ordered": {
                **settings.ORDERED_STREAM,
                "MAX_ATTEMPTS": 1,
                "ISOLATE_FAILURES": False,
                "DATABASE": "other",
            }
        }
    }
)
def test_an_ordered_stream_holds_and_releases_its_keys_on_its_database(handler_mode):
    def add(key: str) -> int:
        [row] = OrderedEvent.objects.using("other").bulk_create([OrderedEvent(aggregate_id=key)])
        return row.id

    runner = InlineRunner()
    handler_mode("fail-key:a")
    with runner.capturing():
        a1 = add("a")
    runner.drain()  # a1 dead-lettered: key a is held, on other
    assert list(HeldKey.objects.using("other").values_list("key", flat=True)) == ["a"]
    assert not HeldKey.objects.using("default").exists()
    handler_mode("ok")
    with runner.capturing():
        a2, b1 = add("a"), add("b")
    runner.drain()
    assert handled_ids("ordered")[-1:] == [b1]  # a2 waits behind the dead letter
    assert on("other", OrderedEvent) == 1
    with runner.capturing():
        assert release_keys("ordered", ["a"]) == 1
    runner.drain()
    assert a2 in handled_ids("ordered") and on("other", OrderedEvent) == 0
    assert on("other", ArchivedEvent, event_id=a1, outcome="failed") == 1

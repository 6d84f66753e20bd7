"""Management commands: outbox_status, outbox_run and outbox_schedules, as an operator uses them."""

from __future__ import annotations

import io
import json
import re

import pytest
from django.conf import settings
from django.core.management import call_command, load_command_class
from django.core.management.base import CommandError
from django.test import override_settings
from django.utils import timezone
from django_q.models import Schedule

from django_outbox import publish_many
from django_outbox.jobs.staging import drain_until_empty, stage_task
from django_outbox.models import ArchivedEvent, OutboxEvent, OutboxGroup, Outcome, StagedJob
from django_outbox.streams.status import KEPT_SHOWN
from django_outbox.streams.steer import set_paused
from tests.conftest import publish_unwoken
from tests.testapp.models import HandledCall

pytestmark = pytest.mark.django_db

STREAMS_HINT = "Configured streams: audit, marketing."


def run(command: str, *args: str) -> str:
    """Call a management command and return what it printed."""
    out = io.StringIO()
    call_command(command, *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def outbox_settings_with(stream: str, **options: object) -> dict:
    """The test DJANGO_OUTBOX setting with *options* changed on *stream*."""
    streams = {name: dict(opts) for name, opts in settings.DJANGO_OUTBOX["STREAMS"].items()}
    streams[stream].update(options)
    return {**settings.DJANGO_OUTBOX, "STREAMS": streams}


# outbox_status ---------------------------------------------------------------------------


def status_rows(output: str) -> dict[str, list[str]]:
    """Parse the status table into {stream: [columns after the name]}."""
    lines = output.splitlines()
    assert lines[0].split() == [
        "stream", "state", "backlog", "lag", "claimed", "running", "retrying",
        "done", "1h", "failed", "1h",
    ]  # fmt: skip
    return {line.split()[0]: line.split()[1:] for line in lines[1:]}


def test_status_shows_every_configured_stream_with_its_backlog():
    publish_many("audit", [{"n": i} for i in range(1234)])

    rows = status_rows(run("outbox_status"))

    assert list(rows) == ["marketing", "audit"]
    assert rows["marketing"] == ["active", "0", "-", "0", "0", "0", "0", "0"]
    state, backlog, lag, *counts = rows["audit"]
    assert (state, backlog, counts) == ("active", "1,234", ["0", "0", "0", "0", "0"])
    assert lag.endswith("s")  # seconds since the oldest unclaimed row; its sign: see below


def test_status_shows_paused_streams_and_archived_counts(inline, handler_mode):
    publish_many("audit", [{"n": i} for i in range(15)])
    inline.distribute("audit")
    handler_mode("raise")
    publish_many("audit", [{"n": i} for i in range(4)])
    inline.distribute("audit")
    set_paused("audit", True)

    rows = status_rows(run("outbox_status", "audit"))

    assert list(rows) == ["audit"]
    assert rows["audit"] == ["paused", "0", "-", "0", "0", "1", "15", "0"]


def test_status_json_is_machine_readable():
    publish_many("audit", [{"n": i} for i in range(3)])
    set_paused("marketing", True)

    data = json.loads(run("outbox_status", "--json"))["streams"]

    assert [s["stream"] for s in data] == ["marketing", "audit"]
    audit = data[1]
    oldest = OutboxEvent.objects.order_by("id").values_list("created_at", flat=True).first()
    assert audit["oldest_unclaimed_at"] == oldest.isoformat()
    assert isinstance(audit.pop("lag_seconds"), float)
    assert audit == {
        "stream": "audit",
        "paused": False,
        "batch_size": 10,
        "backlog": 3,
        "backlog_capped": False,
        "oldest_unclaimed_at": oldest.isoformat(),
        "groups_claimed": 0,
        "groups_running": 0,
        "groups_retrying": 0,
        "groups_dead_lettering": 0,
        "groups_isolating": 0,
        "archived_last_hour": 0,
        "failed_last_hour": 0,
        "runs_in_flight": 0,
        "held_keys": 0,
        "calls_per_second": None,
        "budget_calls": 0,
        "rows_per_second": None,
        "budget_rows": 0,
        "paused_until": None,
        "pause_seconds": 0.0,
        "claim_floor_off": "",
    }
    assert data[0]["paused"] is True
    assert data[0]["backlog"] == 0
    assert data[0]["lag_seconds"] is None
    assert data[0]["oldest_unclaimed_at"] is None


@pytest.mark.django_db(transaction=True)
def test_status_lag_counts_seconds_since_the_oldest_unclaimed_row():
    """In autocommit, as the command runs in production."""
    publish_unwoken("audit", [{"n": 1}])

    (audit,) = json.loads(run("outbox_status", "audit", "--json"))["streams"]
    rows = status_rows(run("outbox_status", "audit"))

    assert 0 <= audit["lag_seconds"] < 60
    assert re.fullmatch(r"\d+s", rows["audit"][2])


def test_status_lag_is_never_negative_inside_a_transaction():
    publish_many("audit", [{"n": 1}])

    (audit,) = json.loads(run("outbox_status", "audit", "--json"))["streams"]
    rows = status_rows(run("outbox_status", "audit"))

    assert audit["lag_seconds"] >= 0
    assert re.fullmatch(r"\d+s", rows["audit"][2])


def test_status_of_selected_streams_only():
    data = json.loads(run("outbox_status", "audit", "--json"))["streams"]

    assert [s["stream"] for s in data] == ["audit"]


def kept_staged_jobs(count: int) -> list[int]:
    """Stage *count* jobs whose function then goes away: the drainer keeps each with its
    error. Their ids, in order."""
    outbox = settings.DJANGO_OUTBOX
    staging = {**outbox["STAGING"], "FORWARD_ON_COMMIT": False}
    with override_settings(DJANGO_OUTBOX={**outbox, "STAGING": staging}):
        ids = [stage_task("tests.testapp.jobs.record", f"job-{n}") for n in range(count)]
        StagedJob.objects.filter(pk__in=ids).update(func="tests.testapp.jobs.gone")
        assert drain_until_empty().kept == count
    return ids


def test_status_names_the_staged_jobs_kept_with_an_error():
    ids = kept_staged_jobs(KEPT_SHOWN + 2)

    lines = run("outbox_status").splitlines()

    [count] = [n for n, line in enumerate(lines) if "staged job(s) kept with an error" in line]
    assert lines[count].startswith(f"{KEPT_SHOWN + 2} staged job(s) kept with an error")
    named = lines[count + 1 :]
    assert len(named) == KEPT_SHOWN + 1
    for pk, line in zip(ids[:KEPT_SHOWN], named[:KEPT_SHOWN], strict=True):
        assert line.startswith(f"  #{pk} tests.testapp.jobs.gone: Cannot import the staged task")
    assert named[-1] == "  … and 2 more."


def test_status_json_has_the_staged_jobs():
    ids = kept_staged_jobs(2)

    staged = json.loads(run("outbox_status", "--json"))["staged_jobs"]

    first_lines = [
        error.splitlines()[0]
        for error in StagedJob.objects.order_by("id").values_list("last_error", flat=True)
    ]
    assert first_lines[0].startswith("Cannot import the staged task")
    assert staged == {
        "waiting": 0,
        "forwarded": 0,
        "kept": 2,
        "kept_jobs": [
            {"id": pk, "func": "tests.testapp.jobs.gone", "database": "default", "error": error}
            for pk, error in zip(ids, first_lines, strict=True)
        ],
    }


def test_status_of_unknown_stream_names_the_configured_ones():
    with pytest.raises(CommandError) as excinfo:
        run("outbox_status", "audit", "nope")

    assert str(excinfo.value) == f"Unknown outbox stream 'nope'. {STREAMS_HINT}"


# outbox_run ------------------------------------------------------------------------------


def test_run_one_round_processes_the_backlog_and_reports_it():
    publish_many("audit", [{"n": i} for i in range(25)])

    output = run("outbox_run")

    # Distribute starts 3 runs (25 rows, batches of 10, RUNS 4), each with a
    # reservation. Run here one after the other, the first claims 10 rows, 10 more, then
    # the last 5, and ending drops the two reservations no job has taken: their jobs do
    # nothing.
    assert output == (
        "Processed 3 groups (done 3) in 3 run job(s); 1 round(s), stopped: one round.\n"
    )
    assert OutboxEvent.objects.count() == 0
    assert OutboxGroup.objects.count() == 0
    assert ArchivedEvent.objects.filter(stream="audit", outcome=Outcome.DONE).count() == 25
    assert sorted(len(c.event_ids) for c in HandledCall.objects.all()) == [5, 10, 10]


def test_run_with_nothing_to_do():
    assert run("outbox_run") == (
        "Processed 0 groups (none) in 0 run job(s); 1 round(s), stopped: one round.\n"
    )


def test_run_selected_stream_leaves_the_others_alone():
    publish_many("audit", [{"n": 1}])

    output = run("outbox_run", "marketing")

    assert output.startswith("Processed 0 groups (none) in 0 run job(s);")
    assert OutboxEvent.objects.filter(group_id__isnull=True).count() == 1


def test_run_unknown_stream_is_a_command_error():
    with pytest.raises(CommandError) as excinfo:
        run("outbox_run", "nope")

    assert str(excinfo.value) == f"Unknown outbox stream 'nope'. {STREAMS_HINT}"
    assert OutboxGroup.objects.count() == 0


def test_run_until_empty_drains_a_backlog():
    publish_many("audit", [{"n": i} for i in range(95)])

    output = run("outbox_run", "audit", "--until-empty")

    # Distribute starts RUNS (4) runs; each run's claims come back full, so the runs
    # claim on in their own worker until the 95 rows are taken.
    assert output == (
        "Processed 10 groups (done 10) in 4 run job(s); 1 round(s), stopped: empty.\n"
    )
    assert OutboxEvent.objects.count() == 0
    archived = ArchivedEvent.objects.filter(stream="audit")
    assert archived.count() == 95
    assert set(archived.values_list("outcome", flat=True)) == {Outcome.DONE}
    assert sorted(p["n"] for p in archived.values_list("data__payload", flat=True)) == list(
        range(95)
    )


@pytest.mark.django_db(transaction=True)
def test_run_until_empty_dead_letters_rows_whose_handler_keeps_failing(handler_mode):
    """MAX_ATTEMPTS=3, BACKOFF_SECONDS=1: waits about 3 s of real backoff, in autocommit."""
    handler_mode("raise")
    publish_many("audit", [{"n": i} for i in range(5)])

    output = run("outbox_run", "audit", "--until-empty")

    # Without a terminal it says why it waits (once: both backoffs are shorter than 5 s).
    assert re.fullmatch(
        r"round 1: 1 groups  audit: backlog 0 in flight 1; waiting for retries: the next "
        r"is due in \d\.\d s \(waited 0 s of --max-wait 300 s\)\n"
        r"Processed 3 groups \(exhausted 1, retrying 2\) in 3 run job\(s\); "
        r"\d+ round\(s\), stopped: empty\.\n",
        output,
    ), output
    assert OutboxEvent.objects.count() == 0
    assert OutboxGroup.objects.count() == 0
    archived = list(ArchivedEvent.objects.filter(stream="audit"))
    assert len(archived) == 5
    assert {(a.outcome, a.attempts) for a in archived} == {(Outcome.FAILED, 3)}
    assert all("RuntimeError: handler exploded" in a.error for a in archived)
    assert [c.attempt for c in HandledCall.objects.order_by("id")] == [1, 2, 3]


def test_run_until_empty_gives_up_when_retries_are_not_due_within_max_wait(handler_mode):
    handler_mode("raise")
    publish_many("audit", [{"n": 1}])
    out = io.StringIO()

    with pytest.raises(CommandError) as excinfo:
        call_command("outbox_run", "audit", "--until-empty", "--max-wait", "0", stdout=out)

    assert str(excinfo.value) == "Rows are left: retries were not due within --max-wait."
    assert out.getvalue().startswith(
        "Processed 1 groups (retrying 1) in 1 run job(s); 1 round(s), stopped: timeout."
    )
    assert OutboxGroup.objects.get().attempt == 1


def test_run_help_shows_the_default_wait():
    out = io.StringIO()
    command = load_command_class("django_outbox", "outbox_run")
    command.create_parser("manage.py", "outbox_run").print_help(out)

    assert "(default: 300)" in " ".join(out.getvalue().split())


def test_run_until_empty_on_a_paused_stream_is_a_command_error():
    publish_many("audit", [{"n": i} for i in range(3)])
    set_paused("audit", True)
    out = io.StringIO()

    with pytest.raises(CommandError) as excinfo:
        call_command("outbox_run", "--until-empty", stdout=out)

    assert str(excinfo.value) == "Rows are left: a stream is paused."
    assert out.getvalue() == (
        "Processed 0 groups (none) in 0 run job(s); 1 round(s), stopped: paused.\n"
    )
    assert OutboxEvent.objects.filter(group_id__isnull=True).count() == 3
    assert not HandledCall.objects.exists()


# outbox_schedules ------------------------------------------------------------------------


def schedules() -> dict[str, tuple]:
    """The django-q2 schedules, by name, as the fields the sync manages."""
    return {
        s.name: (s.func, s.args, s.kwargs, s.schedule_type, s.minutes, s.repeats, s.cluster)
        for s in Schedule.objects.order_by("name")
    }


def distribute_schedule(stream: str, minutes: int = 1, cluster: str | None = None) -> tuple:
    return (
        "django_outbox.tasks.distribute",
        f"('{stream}',)",
        None,
        Schedule.MINUTES,
        minutes,
        -1,
        cluster,
    )


DRAIN_SCHEDULE = ("django_outbox.tasks.drain_staged", "()", None, Schedule.MINUTES, 1, -1, None)
PRUNE_SCHEDULE = ("django_outbox.tasks.prune", "()", None, Schedule.MINUTES, 1440, -1, None)
#: The unique-job kinds of the test settings, each dispatched on a schedule of its own.
KINDS = [
    "blogs.rebuildblogfeed",
    "uniqueapp.keyedjob",
    "uniqueapp.throttledjob",
    "uniqueapp.orderedjob",
    "uniqueapp.readyjob",
    "uniqueapp.beatingjob",
    "uniqueapp.priorityjob",
    # The django.tasks backend's task kind (Django 6.0+).
    *(["django_outbox_tasks.taskrecord"] if settings.TASKS_AVAILABLE else []),
]
KIND_SCHEDULES = {
    f"django_outbox:dispatch:{kind}": (
        "django_outbox.tasks.dispatch_unique",
        f"('{kind}',)",
        None,
        Schedule.MINUTES,
        1,
        -1,
        None,
    )
    for kind in KINDS
}


def test_schedules_creates_distribute_per_stream_drain_and_prune():
    output = run("outbox_schedules")

    assert output == (
        "create django_outbox:distribute:marketing (every 1 min)\n"
        "create django_outbox:distribute:audit (every 1 min)\n"
        "create django_outbox:drain (every 1 min)\n"
        + "".join(f"create django_outbox:dispatch:{kind} (every 1 min)\n" for kind in KINDS)
        + "create django_outbox:prune (every 1440 min)\n"
    )
    assert schedules() == {
        "django_outbox:distribute:audit": distribute_schedule("audit"),
        "django_outbox:distribute:marketing": distribute_schedule("marketing"),
        "django_outbox:drain": DRAIN_SCHEDULE,
        "django_outbox:prune": PRUNE_SCHEDULE,
        **KIND_SCHEDULES,
    }


def test_no_drain_schedule_while_staging_allows_no_module():
    without_staging = {k: v for k, v in settings.DJANGO_OUTBOX.items() if k != "STAGING"}
    with override_settings(DJANGO_OUTBOX={**without_staging, "PRUNE_EVERY_MINUTES": 60}):
        run("outbox_schedules")

    assert "django_outbox:drain" not in schedules()
    assert schedules()["django_outbox:prune"] == (*PRUNE_SCHEDULE[:4], 60, *PRUNE_SCHEDULE[5:])


def test_schedules_twice_changes_nothing():
    run("outbox_schedules")
    before = list(Schedule.objects.order_by("pk").values())

    output = run("outbox_schedules")

    assert output == "Schedules are in sync.\n"
    assert list(Schedule.objects.order_by("pk").values()) == before


def test_schedules_follow_every_minutes_and_cluster_from_the_settings():
    run("outbox_schedules")
    pks = dict(Schedule.objects.values_list("name", "pk"))
    alt = {**settings.Q_CLUSTER, "ALT_CLUSTERS": {"slow": {}}}

    with override_settings(
        Q_CLUSTER=alt,
        DJANGO_OUTBOX=outbox_settings_with("audit", EVERY_MINUTES=5, CLUSTER="slow"),
    ):
        output = run("outbox_schedules")

    assert output == (
        "update django_outbox:distribute:audit (minutes: 1 -> 5, cluster: None -> 'slow')\n"
    )
    assert schedules() == {
        "django_outbox:distribute:audit": distribute_schedule("audit", 5, "slow"),
        "django_outbox:distribute:marketing": distribute_schedule("marketing"),
        "django_outbox:drain": DRAIN_SCHEDULE,
        "django_outbox:prune": PRUNE_SCHEDULE,
        **KIND_SCHEDULES,
    }
    assert dict(Schedule.objects.values_list("name", "pk")) == pks


def test_schedules_repair_a_schedule_edited_by_hand():
    run("outbox_schedules")
    Schedule.objects.filter(name="django_outbox:distribute:audit").update(
        func="elsewhere.task", args="('marketing',)", repeats=0
    )

    output = run("outbox_schedules")

    assert output == (
        "update django_outbox:distribute:audit (func: 'elsewhere.task' -> "
        "'django_outbox.tasks.distribute', args: \"('marketing',)\" -> \"('audit',)\", "
        "repeats: 0 -> -1)\n"
    )
    assert schedules()["django_outbox:distribute:audit"] == distribute_schedule("audit")


def test_schedules_delete_outbox_schedules_no_longer_configured_and_keep_the_users_own():
    run("outbox_schedules")
    own = Schedule.objects.create(
        name="nightly-report", func="reports.tasks.nightly", schedule_type=Schedule.DAILY
    )
    unnamed = Schedule.objects.create(func="reports.tasks.hourly", schedule_type=Schedule.HOURLY)
    Schedule.objects.create(
        name="django_outbox:distribute:legacy",
        func="django_outbox.tasks.distribute",
        args="('legacy',)",
        schedule_type=Schedule.MINUTES,
        minutes=1,
    )
    only_audit = {"STREAMS": {"audit": settings.DJANGO_OUTBOX["STREAMS"]["audit"]}}

    with override_settings(DJANGO_OUTBOX=only_audit):
        output = run("outbox_schedules")

    assert output == (
        "delete django_outbox:distribute:marketing (not in settings)\n"
        "delete django_outbox:drain (not in settings)\n"
        "delete django_outbox:distribute:legacy (not in settings)\n"
    )
    assert set(Schedule.objects.values_list("pk", flat=True)) == {
        Schedule.objects.get(name="django_outbox:distribute:audit").pk,
        Schedule.objects.get(name="django_outbox:prune").pk,
        *Schedule.objects.filter(name__in=KIND_SCHEDULES).values_list("pk", flat=True),
        own.pk,
        unnamed.pk,
    }
    own.refresh_from_db()
    assert (own.func, own.schedule_type) == ("reports.tasks.nightly", Schedule.DAILY)


def test_schedules_remove_a_duplicate_of_a_configured_schedule():
    run("outbox_schedules")
    first = Schedule.objects.get(name="django_outbox:distribute:audit")
    Schedule.objects.create(name=first.name, func=first.func, args=first.args)

    output = run("outbox_schedules")

    assert output.startswith("delete django_outbox:distribute:audit")
    assert len(output.splitlines()) == 1
    assert list(Schedule.objects.filter(name=first.name).values_list("pk", flat=True)) == [first.pk]


def test_schedules_check_reports_drift_changes_nothing_and_exits_1():
    own = Schedule.objects.create(name="nightly-report", func="reports.tasks.nightly")
    out, err = io.StringIO(), io.StringIO()

    with pytest.raises(SystemExit) as excinfo:
        call_command("outbox_schedules", "--check", stdout=out, stderr=err)

    assert excinfo.value.code == 1
    assert out.getvalue() == (
        "would create django_outbox:distribute:marketing (every 1 min)\n"
        "would create django_outbox:distribute:audit (every 1 min)\n"
        "would create django_outbox:drain (every 1 min)\n"
        + "".join(f"would create django_outbox:dispatch:{kind} (every 1 min)\n" for kind in KINDS)
        + "would create django_outbox:prune (every 1440 min)\n"
    )
    assert err.getvalue() == f"{4 + len(KINDS)} schedule(s) drifted from the settings.\n"
    assert list(Schedule.objects.values_list("pk", flat=True)) == [own.pk]


def test_schedules_check_reports_an_update_without_making_it():
    run("outbox_schedules")
    with override_settings(DJANGO_OUTBOX=outbox_settings_with("marketing", EVERY_MINUTES=2)):
        out = io.StringIO()
        with pytest.raises(SystemExit) as excinfo:
            call_command("outbox_schedules", "--check", stdout=out, stderr=io.StringIO())

    assert excinfo.value.code == 1
    assert out.getvalue() == ("would update django_outbox:distribute:marketing (minutes: 1 -> 2)\n")
    assert schedules()["django_outbox:distribute:marketing"] == distribute_schedule("marketing")


def test_schedules_check_exits_normally_when_in_sync():
    run("outbox_schedules")

    assert run("outbox_schedules", "--check") == "Schedules are in sync.\n"


# outbox_replay ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--since", "2026-13-45T00:00:00"],
            "--since '2026-13-45T00:00:00' is not a date and time; give one like "
            "2026-11-24T10:00:00+00:00.",
        ),
        (
            ["--until", "2026-11-24T25:00:00+00:00"],
            "--until '2026-11-24T25:00:00+00:00' is not a date and time; give one like "
            "2026-11-24T10:00:00+00:00.",
        ),
        (
            ["--since", "2026-11-24T10:00:00"],
            "--since '2026-11-24T10:00:00' has no UTC offset; give one like "
            "2026-11-24T10:00:00+00:00 (or end it with Z for UTC).",
        ),
    ],
    ids=["no such date", "no such hour", "naive"],
)
def test_replay_refuses_an_impossible_or_naive_time_with_the_format_to_use(args, message):
    ArchivedEvent.objects.create(
        stream="audit",
        event_id=1,
        data={"stream": "audit", "payload": {}},
        created_at=timezone.now(),
        outcome=Outcome.FAILED,
    )

    with pytest.raises(CommandError) as error:
        run("outbox_replay", *args)

    assert str(error.value) == message
    assert ArchivedEvent.objects.filter(replayed_at__isnull=True).count() == 1
    assert not OutboxEvent.objects.exists()


def test_replay_takes_times_with_an_offset_or_z():
    assert run("outbox_replay", "--since", "2026-11-24T10:00:00Z", "--dry-run") == (
        "No dead letters match.\n"
    )
    assert run("outbox_replay", "--until", "2026-11-24T10:00:00+01:00", "--dry-run") == (
        "No dead letters match.\n"
    )

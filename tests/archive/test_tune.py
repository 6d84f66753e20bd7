"""outbox_tune: table health, autovacuum parameters, and the plans of the pipeline's SQL."""

from __future__ import annotations

import io
import json
import uuid

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, transaction

from django_outbox.archive import tune
from django_outbox.models import OutboxEvent
from django_outbox.streams.sql import buffer_ops
from tests import procs

pytestmark = pytest.mark.django_db(transaction=True)


def run(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("outbox_tune", *args, stdout=out, stderr=err)
        code = 0
    except SystemExit as exc:
        code = int(exc.code)
    return code, out.getvalue(), err.getvalue()


def server_autovacuum() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SHOW autovacuum")
        return cursor.fetchone()[0]


def table_lines(err: str) -> list[str]:
    """The problem lines about tables (server-wide ones start with 'database')."""
    return [line for line in err.splitlines() if not line.startswith("database ")]


@pytest.fixture
def postgres(vendor):
    if vendor != "postgresql":
        pytest.skip("PostgreSQL tier (runs when DATABASE_URL names PostgreSQL)")
    yield
    with connection.cursor() as cursor:  # the parameters outlive the test's rows
        for owned in tune.owned_tables():
            names = ", ".join(tune.CHURN_PARAMETERS) + ", autovacuum_enabled"
            cursor.execute(f"ALTER TABLE {connection.ops.quote_name(owned.table)} RESET ({names})")


def test_on_sqlite_it_says_postgresql_only_and_exits_0(vendor):
    if vendor != "sqlite":
        pytest.skip("the SQLite message")
    assert run("--check", "--apply") == (
        0,
        "outbox_tune applies to PostgreSQL only; nothing to do here.\n",
        "",
    )


@pytest.mark.parametrize(
    "args",
    [
        ["--max-dead-ratio", "2"],
        ["--max-dead-ratio", "lots"],
        ["--min-dead", "-1"],
        ["--database", "nowhere"],
    ],
)
def test_bad_arguments_are_a_command_error_and_change_nothing(args):
    with pytest.raises(CommandError):
        call_command("outbox_tune", "--apply", *args, stdout=io.StringIO())

    if connection.vendor == "postgresql":
        assert all(report.missing for report in tune.report() if report.recommended)


@pytest.mark.postgres
def test_every_owned_table_is_reported_with_its_role(postgres):
    code, out, _ = run()

    assert code == 0
    roles = {r.table: r.role for r in tune.report()}
    assert roles == {
        "django_outbox_outboxevent": "buffer of audit",
        "marketing_contactactivityevent": "buffer of marketing",
        "django_outbox_outboxgroup": "groups",
        "django_outbox_streamstate": "stream state",
        "django_outbox_archivedevent": "archive",
        "django_outbox_stagedjob": "staged jobs",
        "django_outbox_idempotencykey": "idempotency keys",
    } | {r.table: r.role for r in tune.report() if r.role.startswith("unique jobs")}
    for table in roles:
        assert table in out


@pytest.mark.postgres
def test_check_lists_untuned_tables_apply_fixes_them_once(postgres):
    code, _, err = run("--check")
    assert code == 1
    untuned = [line for line in err.splitlines() if "autovacuum parameters not tuned" in line]
    assert {line.split()[0] for line in untuned} >= {
        "django_outbox_outboxevent",
        "marketing_contactactivityevent",
        "django_outbox_outboxgroup",
        "django_outbox_stagedjob",
    }

    code, out, _ = run("--apply")
    assert code == 0
    assert (
        "django_outbox_outboxevent on database 'default': set autovacuum_vacuum_scale_factor=0, "
        in out
    )
    buffer = next(r for r in tune.report() if r.table == "django_outbox_outboxevent")
    assert buffer.options["autovacuum_vacuum_scale_factor"] == "0"
    assert buffer.options["autovacuum_vacuum_threshold"] == "5000"

    code, out, err = run("--apply", "--check")
    assert ": set " not in out  # idempotent: nothing left to change
    assert table_lines(err) == []
    if server_autovacuum() == "on":
        assert (code, err) == (0, "")
        assert out.endswith("No problems found.\n")
    else:  # a server with autovacuum off is a problem of its own
        assert code == 1


@pytest.mark.postgres
def test_check_reports_a_table_full_of_dead_tuples(postgres):
    run("--apply")
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE django_outbox_outboxevent SET (autovacuum_enabled = false)")
    OutboxEvent.objects.bulk_create(
        [OutboxEvent(stream="audit", payload={"n": n}) for n in range(3000)]
    )
    OutboxEvent.objects.filter(id__in=OutboxEvent.objects.values("id")[:2000]).delete()

    def dead() -> int:
        report = next(r for r in tune.report() if r.table == "django_outbox_outboxevent")
        return report.dead_tuples

    procs.wait_until(lambda: dead() >= 2000, timeout=30, describe=dead)
    code, _, err = run("--check", "--max-dead-ratio", "0.5", "--min-dead", "1000")

    assert code == 1
    disabled, ratio = table_lines(err)
    assert disabled == (
        "django_outbox_outboxevent (buffer of audit) on database 'default': autovacuum is "
        "disabled for this table "
        "(autovacuum_enabled=false); run ALTER TABLE django_outbox_outboxevent RESET "
        "(autovacuum_enabled)."
    )
    assert ratio.startswith(
        "django_outbox_outboxevent (buffer of audit) on database 'default': 67% dead tuples"
    )
    assert table_lines(run("--check", "--max-dead-ratio", "0.7")[2]) == [disabled]


@pytest.mark.postgres
def test_the_servers_autovacuum_settings_are_reported(postgres):
    _, out, err = run("--check")

    autovacuum = server_autovacuum()
    assert out.startswith(f"database default: autovacuum {autovacuum}, naptime ")
    server_lines = [line for line in err.splitlines() if line.startswith("database ")]
    if autovacuum == "on":
        assert server_lines == []
    else:
        assert server_lines == [
            "database 'default': autovacuum is off on this server, so dead tuples are never "
            "removed automatically and the tables' autovacuum parameters have no effect; set "
            "autovacuum = on in postgresql.conf."
        ]


def test_autovacuum_or_track_counts_off_on_the_server_is_a_problem():
    off = tune.ServerReport("default", {"autovacuum": "off", "track_counts": "off"})
    on = tune.ServerReport("default", {"autovacuum": "on", "track_counts": "on"})

    lines = tune.problems([], max_dead_ratio=0.2, min_dead=1000, server_reports=[off])

    assert [line.split(":")[0] for line in lines] == ["database 'default'"] * 2
    assert "autovacuum is off on this server" in lines[0]
    assert "track_counts is off" in lines[1]
    assert tune.problems([], max_dead_ratio=0.2, min_dead=1000, server_reports=[on]) == []


@pytest.mark.postgres
def test_json_output_is_machine_readable(postgres):
    code, out, _ = run("--json", "--explain")

    data = json.loads(out)
    assert code == 0
    assert [s["database"] for s in data["servers"]] == ["default"]
    assert data["servers"][0]["settings"]["autovacuum"] == server_autovacuum()
    assert {t["table"] for t in data["tables"]} >= {"django_outbox_outboxevent"}
    assert {(p["stream"], p["statement"]) for p in data["plans"]} == {
        (stream, name)
        for stream in ("audit", "marketing")
        for name in ("claim", "group fetch", "finalize")
    }


@pytest.mark.postgres
def test_explain_prints_the_plan_of_each_pipeline_statement(postgres):
    code, out, _ = run("--explain")

    assert code == 0
    for stream in ("audit", "marketing"):
        for name in ("claim", "group fetch", "finalize"):
            assert f"-- {stream}: {name} (database default)\n" in out
    assert "LockRows" in out  # the claim's FOR UPDATE SKIP LOCKED


# -- the query-plan regression test --------------------------------------------------------

ROWS = 100_000


def fill(table: str, stream_column: bool) -> None:
    with connection.cursor() as cursor:
        if stream_column:
            cursor.execute(
                f"INSERT INTO {table} (created_at, stream, payload) "
                "SELECT now(), 'audit', jsonb_build_object('n', n) FROM generate_series(1, %s) n",
                [ROWS],
            )
        else:
            cursor.execute(
                f"INSERT INTO {table} (created_at, activity_id) "
                "SELECT now(), a.id FROM generate_series(1, %s) n "
                "CROSS JOIN LATERAL (SELECT id FROM marketing_contactactivity LIMIT 1) a",
                [ROWS],
            )


@pytest.mark.postgres
def test_plans_use_the_partial_indexes_never_a_sequential_scan_of_the_buffer(postgres):
    from marketing.models import ContactActivityEvent, Lead

    lead = Lead.objects.create(email="plan@example.com", name="Plan")
    lead.activities.create(kind="call", comment="")
    fill("django_outbox_outboxevent", stream_column=True)
    fill("marketing_contactactivityevent", stream_column=False)
    for model, stream in ((OutboxEvent, "audit"), (ContactActivityEvent, None)):
        ops = buffer_ops(model, stream)
        for _ in range(20):  # groups in flight at the front, the rest unclaimed
            with transaction.atomic():
                ops.claim(uuid.uuid4(), 1000)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE django_outbox_outboxevent")
        cursor.execute("ANALYZE marketing_contactactivityevent")

    statements = tune.pipeline_statements()
    assert len(statements) == 6
    for statement in statements:
        plan = tune.plan(statement)
        on_buffer = [s for s in tune.scans(plan) if s[1] == statement.table]
        assert on_buffer, statement
        assert "Seq Scan" not in {node for node, _, _ in on_buffer}, (statement, on_buffer)
        used = {index for _, _, index in tune.scans(plan) if index} | bitmap_indexes(plan)
        partial = {
            index.name
            for index in statement_model(statement)._meta.indexes
            if index.condition is not None
        }
        assert used & partial, (statement.stream, statement.name, used, partial)


def bitmap_indexes(node: dict) -> set[str]:
    found = {node["Index Name"]} if node.get("Node Type") == "Bitmap Index Scan" else set()
    for child in node.get("Plans", ()):
        found |= bitmap_indexes(child)
    return found


def statement_model(statement: tune.Statement):
    from django_outbox.conf import get_stream

    return get_stream(statement.stream).model_class

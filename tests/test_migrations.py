"""Migrations: in step with the models, one per app that stands for the development
history, reversible with the functions and triggers they install, buffer tables with only
their partial indexes (two; the generic buffer a third, for ordered streams, that
unordered rows skip)."""

from __future__ import annotations

import io

import django
import pytest
from django.apps import apps
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.recorder import MigrationRecorder
from django.db.models import Q

from django_outbox.conf import outbox_settings
from django_outbox.streams.sql import claim_floor
from django_outbox.streams.sql.triggers import KeyGuardSpec

OUTBOX_TABLES = {
    "django_outbox_archivedevent",
    "django_outbox_outboxevent",
    "django_outbox_outboxgroup",
    "django_outbox_streamstate",
}

#: The app labels of the library's migrations; the django.tasks backend's is installed
#: from Django 6.0 on.
OUTBOX_APPS = [
    "django_outbox",
    pytest.param(
        "django_outbox_tasks",
        marks=pytest.mark.skipif(
            django.VERSION < (6, 0), reason="django.tasks exists from Django 6.0 on"
        ),
    ),
]

#: The migrations of the development history, which each app's 0001_initial replaces.
HISTORY = {
    "django_outbox": [
        "0001_initial",
        "0002_archive_replayed_at",
        "0003_staged_jobs_and_idempotency_keys",
        "0004_archive_index_by_outcome",
        "0005_operator_permissions",
        "0006_stream_kicked_at",
        "0007_stream_runs",
        "0008_hardening",
        "0009_failure_isolation",
        "0010_staged_forwarded_at",
        "0011_staged_forward_count",
        "0012_streamstate_claim_floor",
        "0013_streamstate_wake_epoch",
        "0014_kindstate",
        "0015_held_keys",
        "0016_stream_rate_budget",
        "0017_outboxevent_payload_encoder",
        "0018_trace_context",
        "0019_stream_row_budget",
        "0020_outboxevent_order_key",
        "0021_job_wake_function",
        "0022_bounded_wake_guard",
        "0023_outboxevent_order_key_guard",
        "0024_claim_floor_holes",
    ],
    "django_outbox_tasks": [
        "0001_initial",
        "0002_job_token",
        "0003_trace_context",
        "0004_keyless_tasks_unindexed",
    ],
}

#: The migrations each app ships: 0001_initial, which replaces the development history,
#: and those added since.
RELEASED = {
    "django_outbox": [
        "0001_initial",
        "0002_publish_wake",
        "0003_publish_wake_asked_once",
        "0004_drop_keyed_index",
    ],
    "django_outbox_tasks": ["0001_initial"],
}

#: The functions the outbox's migration installs on PostgreSQL: the wake guard's and
#: the claim floor's (the generic buffer's order-key guard has one too, named by its table).
OUTBOX_FUNCTIONS = {
    "django_outbox_publish_wake",
    "django_outbox_job_wake",
    "django_outbox_floor_guard",
    "django_outbox_floor_hole",
}

#: (model label, [(fields, condition)]) of the partial indexes of each buffer model.
BUFFER_INDEXES = [
    (
        "marketing.ContactActivityEvent",
        [(["id"], Q(group_id__isnull=True)), (["group_id"], Q(group_id__isnull=False))],
    ),
    (
        "django_outbox.OutboxEvent",
        [
            (["stream", "id"], Q(group_id__isnull=True)),
            (["group_id"], Q(group_id__isnull=False)),
        ],
    ),
]
#: The predicate each live index must carry, as the database spells it.
PREDICATES = {
    "postgresql": {
        True: "WHERE (group_id IS NULL)",
        False: "WHERE (group_id IS NOT NULL)",
    },
    "sqlite": {
        True: 'WHERE "group_id" IS NULL',
        False: 'WHERE "group_id" IS NOT NULL',
    },
}


@pytest.mark.django_db
def test_makemigrations_finds_no_changes_for_any_app():
    out = io.StringIO()

    # --check exits with status 1 when a model changed without a migration.
    call_command("makemigrations", "--check", "--dry-run", stdout=out, stderr=io.StringIO())

    assert out.getvalue() == "No changes detected\n"


@pytest.mark.django_db
@pytest.mark.parametrize("app_label", OUTBOX_APPS)
def test_makemigrations_finds_no_changes_for_the_outbox_apps(app_label):
    out = io.StringIO()

    call_command(
        "makemigrations", app_label, "--check", "--dry-run", stdout=out, stderr=io.StringIO()
    )

    assert out.getvalue() == f"No changes detected in app '{app_label}'\n"


@pytest.mark.parametrize("app_label", OUTBOX_APPS)
def test_each_outbox_app_ships_the_squashed_history_and_the_migrations_since(app_label):
    loader = MigrationLoader(None, ignore_no_migrations=True)

    assert sorted(key for key in loader.disk_migrations if key[0] == app_label) == [
        (app_label, name) for name in RELEASED[app_label]
    ]
    initial = loader.disk_migrations[app_label, "0001_initial"]
    # Its own name is the history's first: listed in replaces, Django would drop it.
    assert initial.replaces == [(app_label, name) for name in HISTORY[app_label][1:]]


@pytest.mark.django_db
@pytest.mark.parametrize("app_label", OUTBOX_APPS)
def test_a_database_migrated_through_the_development_history_is_up_to_date(app_label):
    """A database migrated through the history (its django_migrations rows, in the
    history's order) counts 0001_initial as applied and has nothing to migrate."""
    recorder = MigrationRecorder(connection)
    recorder.migration_qs.filter(app=app_label).delete()
    for name in HISTORY[app_label]:
        recorder.record_applied(app_label, name)

    executor = MigrationExecutor(connection)

    assert (app_label, "0001_initial") in executor.loader.applied_migrations
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    # What came after the squash, and nothing else, remains to apply.
    assert [(m.app_label, m.name) for m, _ in plan] == [
        (app_label, name) for name in RELEASED[app_label][1:]
    ]


@pytest.mark.django_db(transaction=True)
def test_outbox_migrations_unapply_and_apply_cleanly():
    """Migrate django_outbox to zero and back; its tables go and come back with their
    indexes, and the functions and triggers its migration installs with them.

    A transactional test, because schema changes inside the test transaction would not be
    rolled back on every vendor; the ``finally`` re-applies the migrations so a failure
    here cannot leave later tests without tables.
    """
    options = {"stdout": io.StringIO(), "verbosity": 0}
    installed = outbox_routines()
    assert generic_buffer_routines() <= installed
    try:
        call_command("migrate", "django_outbox", "zero", **options)
        assert OUTBOX_TABLES.isdisjoint(connection.introspection.table_names())
        assert "marketing_contactactivityevent" in connection.introspection.table_names()
        assert outbox_routines() == set()

        call_command("migrate", "django_outbox", **options)
        assert OUTBOX_TABLES <= set(connection.introspection.table_names())
        assert generic_buffer_routines() <= outbox_routines()
    finally:
        # Unapplying django_outbox also unapplied the migrations that depend on it
        # (tests.testapp's PublishTrigger); bring every app back.
        call_command("migrate", **options)
    assert "testapp_purchase" in connection.introspection.table_names()
    # The claim floor's trigger is installed on the buffer tables of the streams the
    # settings configure (post_migrate): one that an earlier test's streams left on
    # another table is not put back, rightly.
    assert floor_triggers_of_configured(outbox_routines()) == floor_triggers_of_configured(
        installed
    )
    model = apps.get_model("django_outbox.OutboxEvent")
    assert live_indexes(model._meta.db_table) == {
        index.name: (index.fields, partial_predicate(index.condition))
        for index in model._meta.indexes
    }
    loader = MigrationLoader(connection)
    assert ("django_outbox", "0001_initial") in loader.applied_migrations


@pytest.mark.parametrize(("label", "expected"), BUFFER_INDEXES)
def test_buffer_model_has_exactly_its_partial_indexes(label, expected):
    model = apps.get_model(label)
    state = MigrationLoader(None, ignore_no_migrations=True).project_state()
    state_indexes = state.models[model._meta.app_label, model._meta.model_name].options["indexes"]

    for indexes in (model._meta.indexes, state_indexes):
        assert [(index.fields, index.condition) for index in indexes] == expected
        assert all(index.condition is not None for index in indexes)
        assert all(len(index.name) <= 30 for index in indexes)
    assert [index.name for index in state_indexes] == [index.name for index in model._meta.indexes]


def test_custom_buffer_index_names_are_unique_per_model():
    """Index names are global in a database: each buffer model gets its own."""
    names = [
        index.name for label, _ in BUFFER_INDEXES for index in apps.get_model(label)._meta.indexes
    ]
    assert len(names) == len(set(names)) == 4


@pytest.mark.django_db
@pytest.mark.parametrize(("label", "expected"), BUFFER_INDEXES)
def test_buffer_table_has_only_its_primary_key_and_partial_indexes(label, expected):
    model = apps.get_model(label)
    table = model._meta.db_table
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, table)
    indexed = {
        name: c for name, c in constraints.items() if c["index"] or c["primary_key"] or c["unique"]
    }
    primary = [c["columns"] for c in indexed.values() if c["primary_key"]]
    names = {index.name for index in model._meta.indexes}

    assert primary == [["id"]]
    assert {name for name, c in indexed.items() if not c["primary_key"]} == names
    assert live_indexes(table) == {
        name: (fields, partial_predicate(condition))
        for name, (fields, condition) in zip(
            [index.name for index in model._meta.indexes], expected, strict=True
        )
    }


def outbox_routines() -> set[tuple[str, str, str]]:
    """The outbox's functions and triggers in the database, read live: ("function", name)
    of each function (PostgreSQL) and ("trigger", name, table) of each trigger named
    ``django_outbox…`` or ``outbox_key_…`` (the order-key guards)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT 'function', p.proname, '' FROM pg_proc p "
                "WHERE pg_function_is_visible(p.oid) "
                "AND (p.proname LIKE 'django_outbox%' OR p.proname LIKE 'outbox_key_%') "
                "UNION ALL SELECT 'trigger', t.tgname, c.relname FROM pg_trigger t "
                "JOIN pg_class c ON c.oid = t.tgrelid WHERE pg_table_is_visible(c.oid) "
                "AND (t.tgname LIKE 'django_outbox%' OR t.tgname LIKE 'outbox_key_%')"
            )
        else:
            cursor.execute(
                "SELECT 'trigger', name, tbl_name FROM sqlite_master WHERE type = 'trigger' "
                "AND (name LIKE 'django_outbox%' OR name LIKE 'outbox_key_%')"
            )
        return set(cursor.fetchall())


def floor_triggers_of_configured(
    routines: set[tuple[str, str, str]],
) -> set[tuple[str, str, str]]:
    """*routines* without the claim floor's triggers on tables no configured stream uses."""
    tables = {config.model_class._meta.db_table for config in outbox_settings().streams.values()}
    return {
        routine
        for routine in routines
        if not (routine[:2] == ("trigger", claim_floor.TRIGGER) and routine[2] not in tables)
    }


def generic_buffer_routines() -> set[tuple[str, str, str]]:
    """What django_outbox's migration installs for the generic buffer: its order-key
    guard, and on PostgreSQL the claim floor's trigger and the functions."""
    table = apps.get_model("django_outbox.OutboxEvent")._meta.db_table
    guard = KeyGuardSpec(table=table, key="order_key").name
    if connection.vendor != "postgresql":
        return {("trigger", guard, table)}
    functions = {("function", name, "") for name in {*OUTBOX_FUNCTIONS, guard}}
    return functions | {("trigger", guard, table), ("trigger", claim_floor.TRIGGER, table)}


def partial_predicate(condition: Q) -> str:
    """The WHERE clause the database shows for a ``group_id__isnull`` condition."""
    ((lookup, isnull),) = condition.children
    assert lookup == "group_id__isnull"
    return PREDICATES[connection.vendor][isnull]


def live_indexes(table: str) -> dict[str, tuple[list[str], str]]:
    """Every non-primary-key index on *table*: {name: (columns, WHERE clause)}, read live."""
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, table)
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = %s", [table]
            )
        else:
            cursor.execute(
                "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = %s",
                [table],
            )
        definitions = dict(cursor.fetchall())
    result = {}
    for name, definition in definitions.items():
        if constraints.get(name, {}).get("primary_key") or definition is None:
            continue  # the primary key (SQLite's autoindexes have no SQL)
        where = definition[definition.index(" WHERE ") + 1 :] if " WHERE " in definition else ""
        result[name] = (constraints[name]["columns"], where)
    return result

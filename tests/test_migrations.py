"""Migrations: in step with the models, reversible, buffer tables with only their partial
indexes (two; the generic buffer a third, for ordered streams, that unordered rows skip)."""

from __future__ import annotations

import io

import pytest
from django.apps import apps
from django.core.management import call_command
from django.db import connection
from django.db.migrations.loader import MigrationLoader
from django.db.models import Q

OUTBOX_TABLES = {
    "django_outbox_archivedevent",
    "django_outbox_outboxevent",
    "django_outbox_outboxgroup",
    "django_outbox_streamstate",
}

#: The generic buffer's index of ordered streams' keys: only rows with a key are in it.
KEYED = Q(group_id__isnull=True, order_key__isnull=False)
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
            (["stream", "order_key", "id"], KEYED),
        ],
    ),
]
#: The predicate each live index must carry, as the database spells it.
PREDICATES = {
    "postgresql": {
        True: "WHERE (group_id IS NULL)",
        False: "WHERE (group_id IS NOT NULL)",
        "keyed": "WHERE ((group_id IS NULL) AND (order_key IS NOT NULL))",
    },
    "sqlite": {
        True: 'WHERE "group_id" IS NULL',
        False: 'WHERE "group_id" IS NOT NULL',
        "keyed": 'WHERE ("group_id" IS NULL AND "order_key" IS NOT NULL)',
    },
}


@pytest.mark.django_db
def test_makemigrations_finds_no_changes_for_any_app():
    out = io.StringIO()

    # --check exits with status 1 when a model changed without a migration.
    call_command("makemigrations", "--check", "--dry-run", stdout=out, stderr=io.StringIO())

    assert out.getvalue() == "No changes detected\n"


@pytest.mark.django_db(transaction=True)
def test_outbox_migrations_unapply_and_apply_cleanly():
    """Migrate django_outbox to zero and back; its tables go and come back with their indexes.

    A transactional test, because schema changes inside the test transaction would not be
    rolled back on every vendor; the ``finally`` re-applies the migrations so a failure
    here cannot leave later tests without tables.
    """
    options = {"stdout": io.StringIO(), "verbosity": 0}
    try:
        call_command("migrate", "django_outbox", "zero", **options)
        assert OUTBOX_TABLES.isdisjoint(connection.introspection.table_names())
        assert "marketing_contactactivityevent" in connection.introspection.table_names()

        call_command("migrate", "django_outbox", **options)
        assert OUTBOX_TABLES <= set(connection.introspection.table_names())
    finally:
        # Unapplying django_outbox also unapplied the migrations that depend on it
        # (tests.testapp's PublishTrigger); bring every app back.
        call_command("migrate", **options)
    assert "testapp_purchase" in connection.introspection.table_names()
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
    assert len(names) == len(set(names)) == 5


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


def partial_predicate(condition: Q) -> str:
    """The WHERE clause the database shows for a ``group_id__isnull`` condition (or the
    generic buffer's keyed one)."""
    if condition == KEYED:
        return PREDICATES[connection.vendor]["keyed"]
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

"""Unique-job models: the partial indexes each kind's options call for, live in the database."""

from __future__ import annotations

import pytest
from django.db import connection, models
from django.db.migrations.state import ModelState
from django.test.utils import isolate_apps

from django_outbox.models import UniqueJob
from tests.uniqueapp.models import KeyedJob, OrderedJob, ReadyJob, ThrottledJob

KINDS = [KeyedJob, OrderedJob, ReadyJob, ThrottledJob]


def live_indexes(table: str) -> dict[str, tuple[list[str], bool, str]]:
    """{name: (columns, unique, WHERE clause)} of every non-primary index, read live."""
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
    return {
        name: (
            constraints[name]["columns"],
            constraints[name]["unique"],
            definition[definition.index(" WHERE ") + 7 :] if " WHERE " in definition else "",
        )
        for name, definition in definitions.items()
        if definition and not constraints[name]["primary_key"]
    }


def predicate(states: list[str]) -> str:
    if connection.vendor == "postgresql":
        if len(states) == 1:
            return f"((state)::text = '{states[0]}'::text)"
        return (
            "((state)::text = ANY ((ARRAY['processed'::character varying, "
            "'failed'::character varying])::text[]))"
        )
    if len(states) == 1:
        return f"\"state\" = '{states[0]}'"
    return "\"state\" IN ('processed', 'failed')"


def unstarted_predicate() -> str:
    """The condition of the unique index: pending, or dispatched and not started."""
    if connection.vendor == "postgresql":
        return (
            "(((state)::text = 'pending'::text) OR ((started_at IS NULL) AND "
            "((state)::text = 'running'::text)))"
        )
    return '("state" = \'pending\' OR ("started_at" IS NULL AND "state" = \'running\'))'


@pytest.mark.django_db
def test_a_kind_with_one_key_has_its_unique_and_dispatch_indexes_live():
    names = {index.name: index for index in [*KeyedJob._meta.indexes, *KeyedJob._meta.constraints]}
    by_role = {name.split("_")[2]: name for name in names}

    assert live_indexes(KeyedJob._meta.db_table) == {
        by_role["pend"]: (["key"], True, unstarted_predicate()),
        by_role["run"]: (["key"], True, predicate(["running"])),
        by_role["next"]: (["id"], False, predicate(["pending"])),
        by_role["lease"]: (["lease_expires_at"], False, predicate(["running"])),
        by_role["done"]: (["finished_at"], False, predicate(["processed", "failed"])),
    }


@pytest.mark.django_db
def test_ready_ordering_and_a_wider_unique_key_get_their_own_indexes():
    live = live_indexes(ReadyJob._meta.db_table)
    shapes = sorted((columns, unique) for columns, unique, _ in live.values())

    assert shapes == [
        (["finished_at"], False),
        (["key"], True),  # running: unique while executing
        (["key", "id"], False),  # pending jobs of a key, for the ordering checks
        (["key", "seq"], True),  # not started: unique until a worker starts it
        (["lease_expires_at"], False),
        (["process_after", "id"], False),  # first ready, first served
    ]


def test_index_names_are_short_and_unique_across_kinds():
    names = [
        item.name for model in KINDS for item in [*model._meta.indexes, *model._meta.constraints]
    ]
    assert all(len(name) <= 30 and name[0].isalpha() for name in names)
    assert len(names) == len(set(names))


def test_a_kind_with_a_meta_of_its_own_still_gets_its_indexes_in_the_migration_state():
    with isolate_apps("tests.uniqueapp"):

        class Custom(UniqueJob):
            blog = models.IntegerField()

            class Job:
                unique_fields = ["blog"]

            class Meta:
                app_label = "uniqueapp"
                verbose_name = "custom job"

            def perform(self, heartbeat):
                pass

        state = ModelState.from_model(Custom)

    assert [c.fields for c in state.options["constraints"]] == [("blog",), ("blog",)]
    assert len(state.options["indexes"]) == 3

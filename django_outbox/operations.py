"""Migration operations.

``PublishTrigger`` installs database triggers that publish an event to the generic
buffer whenever a row of an application table is inserted, updated or deleted, from any
code path (the ORM, ``bulk_create``, ``QuerySet.update()``, raw SQL, another service
writing to the same database). The event is written by the statement that changed the
row, so it commits and rolls back with it and costs the transaction no extra round trip.

``GuardOrderKey`` makes an ordered stream's buffer refuse an UPDATE that changes the
key of a row in a group (a trigger), so no later row of the key can overtake it.

``PartitionArchive`` partitions the archive by outcome and time on PostgreSQL, so that
retention drops whole partitions instead of deleting rows (see
:mod:`django_outbox.archive.partitions`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.core.exceptions import FieldDoesNotExist
from django.db import router
from django.db.migrations.operations.base import Operation

from django_outbox.archive.sql import partitions as partition_sql
from django_outbox.base.dialect import database_now
from django_outbox.conf import STREAM_NAME, outbox_settings
from django_outbox.streams.sql.triggers import (
    OPERATIONS,
    KeyGuardSpec,
    TriggerSpec,
    create_statements,
    drop_statements,
    key_guard_drop_statements,
    key_guard_statements,
)

__all__ = [
    "GuardOrderKey",
    "PartitionArchive",
    "PublishTrigger",
]


class _TriggerOperation(Operation):
    """A migration operation that installs a trigger: nothing in the model state, the
    trigger's statements forwards and its drop backwards, on the databases the model is
    routed to (``_spec`` returns None elsewhere)."""

    reversible = True
    reduces_to_sql = True

    def _spec(self, app_label: str, schema_editor: Any, state: Any) -> Any:
        raise NotImplementedError

    def create_sql(self, connection: Any, spec: Any) -> Iterable[str]:
        raise NotImplementedError

    def drop_sql(self, connection: Any, spec: Any) -> Iterable[str]:
        raise NotImplementedError

    def state_forwards(self, app_label: str, state: Any) -> None:
        """Change nothing in the model state: triggers live only in the database."""

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        spec = self._spec(app_label, schema_editor, to_state)
        if spec is not None:
            for sql in self.create_sql(schema_editor.connection, spec):
                schema_editor.execute(sql, params=None)

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        spec = self._spec(app_label, schema_editor, from_state)
        if spec is not None:
            for sql in self.drop_sql(schema_editor.connection, spec):
                schema_editor.execute(sql, params=None)


class PublishTrigger(_TriggerOperation):
    """Publish a model's row changes to *stream* through database triggers.

    ``PublishTrigger("order", stream="orders", fields=["id", "amount"])`` publishes
    ``{"op": "insert", "id": ..., "amount": ...}`` for every new row; with
    ``on=["insert", "update", "delete"]`` also updates that change a listed field (the
    new values) and deletes (the old values). Values are the database's JSON rendering
    of the columns. The stream must use the generic buffer (no ``MODEL`` option).
    """

    def __init__(
        self,
        model_name: str,
        stream: str,
        fields: Iterable[str],
        on: Iterable[str] = ("insert",),
    ) -> None:
        self.model_name = model_name
        self.stream = stream
        self.fields = list(fields)
        self.on = [op.lower() for op in on]
        if not isinstance(stream, str) or not STREAM_NAME.match(stream):
            raise ValueError(
                f"PublishTrigger: {stream!r} is not a stream name (lower-case letters, "
                "digits, '_' and '-', at most 64 characters)."
            )
        if not self.fields:
            raise ValueError("PublishTrigger: name at least one field to publish.")
        if "op" in self.fields:
            raise ValueError(
                "PublishTrigger: 'op' is the payload key of the operation; rename the field."
            )
        unknown = [op for op in self.on if op not in OPERATIONS]
        if unknown or not self.on or len(set(self.on)) != len(self.on):
            raise ValueError(
                f"PublishTrigger: on={list(on)!r}; choose one or more of "
                f"{', '.join(OPERATIONS)}, each once."
            )

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        kwargs: dict[str, Any] = {"stream": self.stream, "fields": self.fields}
        if self.on != ["insert"]:
            kwargs["on"] = self.on
        return self.__class__.__qualname__, [self.model_name], kwargs

    def create_sql(self, connection: Any, spec: TriggerSpec) -> Iterable[str]:
        return create_statements(connection, spec)

    def drop_sql(self, connection: Any, spec: TriggerSpec) -> Iterable[str]:
        return drop_statements(connection, spec)

    def describe(self) -> str:
        return f"Publish {', '.join(self.on)} of {self.model_name} to stream {self.stream}"

    @property
    def migration_name_fragment(self) -> str:
        return f"publish_{self.model_name.lower()}_{self.stream.replace('-', '_')}"

    def _spec(self, app_label: str, schema_editor: Any, state: Any) -> TriggerSpec | None:
        """Resolve table and columns from the migration state; None when not routed here."""
        model = state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return None
        try:
            buffer = state.apps.get_model("django_outbox", "OutboxEvent")
        except LookupError:
            raise ValueError(
                f"PublishTrigger on {app_label}.{self.model_name}: the migration must depend "
                "on django_outbox's, e.g. ('django_outbox', '0001_initial')."
            ) from None
        alias = schema_editor.connection.alias
        if not router.allow_migrate_model(alias, buffer):
            # The buffer is on every database that holds streams (a stream's rows live on
            # its database): a trigger writes to the one beside its table.
            raise ValueError(
                f"PublishTrigger on {app_label}.{self.model_name}: the outbox buffer is not "
                f"migrated on database {alias!r}, the table's; a trigger can only write to "
                "its own database (let the router migrate django_outbox there)."
            )
        columns = []
        for name in self.fields:
            try:
                field = model._meta.get_field(name)
            except FieldDoesNotExist:
                raise ValueError(
                    f"PublishTrigger on {app_label}.{self.model_name}: no field {name!r}."
                ) from None
            if not getattr(field, "concrete", False) or field.column is None:
                raise ValueError(
                    f"PublishTrigger on {app_label}.{self.model_name}: {name!r} has no column."
                )
            columns.append(field.column)
        return TriggerSpec(
            table=model._meta.db_table,
            buffer=buffer._meta.db_table,
            stream=self.stream,
            keys=list(self.fields),
            columns=columns,
            on=list(self.on),
        )


class GuardOrderKey(_TriggerOperation):
    """Refuse to change the ``ORDER_KEY`` of a buffer row while it is in a group.

    An ordered stream's claim keeps a key's later rows in the buffer while a row of the
    key is in a group (claimed, running, waiting for a retry), reading the key's value
    in the buffer: a row whose key changed in flight would free its old key, and the
    old key's later rows would overtake it. ``GuardOrderKey("orderevent", "account_id")``
    in a migration of the buffer model's app installs a trigger that makes such an
    UPDATE fail (``IntegrityError``, naming the rule); a row still waiting may be
    re-keyed. The trigger runs only for an UPDATE that sets the key column: the
    pipeline's statements never do. The generic buffer has it (``order_key``).
    """

    def __init__(self, model_name: str, field: str) -> None:
        self.model_name = model_name
        self.field = field

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        return self.__class__.__qualname__, [self.model_name, self.field], {}

    def create_sql(self, connection: Any, spec: KeyGuardSpec) -> Iterable[str]:
        return key_guard_statements(connection, spec)

    def drop_sql(self, connection: Any, spec: KeyGuardSpec) -> Iterable[str]:
        return key_guard_drop_statements(connection, spec)

    def describe(self) -> str:
        return f"Refuse changes of {self.model_name}.{self.field} while its row is in a group"

    @property
    def migration_name_fragment(self) -> str:
        return f"guard_{self.model_name.lower()}_{self.field.lower()}"

    def _spec(self, app_label: str, schema_editor: Any, state: Any) -> KeyGuardSpec | None:
        """Resolve the table and columns from the migration state; None when not routed here."""
        model = state.apps.get_model(app_label, self.model_name)
        if not self.allow_migrate_model(schema_editor.connection.alias, model):
            return None
        columns = []
        for name in (self.field, "group_id"):
            try:
                field = model._meta.get_field(name)
            except FieldDoesNotExist:
                raise ValueError(
                    f"GuardOrderKey on {app_label}.{self.model_name}: no field {name!r}."
                ) from None
            if not getattr(field, "concrete", False) or field.column is None:
                raise ValueError(
                    f"GuardOrderKey on {app_label}.{self.model_name}: {name!r} has no column."
                )
            columns.append(field.column)
        return KeyGuardSpec(table=model._meta.db_table, key=columns[0], group=columns[1])


class PartitionArchive(Operation):
    """Partition the archive by outcome, then by ``archived_at`` in steps of *interval*.

    Add ``PartitionArchive(interval="1 day")`` to a migration of your project that
    depends on django_outbox's latest migration. On PostgreSQL it renames the archive
    table, creates the partitioned table in its place (primary key
    ``(id, outcome, archived_at)``, the same columns, indexes and id sequence), keeps the
    old rows as the legacy partitions (the dead letters are copied, the done rows stay
    where they are) and creates the partitions of the current and next intervals. The
    table is locked meanwhile. On other databases it does nothing: retention deletes.
    Reversing copies every row into a plain table again.
    """

    reversible = True
    reduces_to_sql = False
    atomic = True

    def __init__(self, interval: str = "1 day") -> None:
        self.interval = interval
        self.width = partition_sql.parse_interval(interval)

    def deconstruct(self) -> tuple[str, list[Any], dict[str, Any]]:
        return self.__class__.__qualname__, [], {"interval": self.interval}

    def state_forwards(self, app_label: str, state: Any) -> None:
        """Change nothing in the model state: the primary key Django uses stays ``id``."""

    def database_forwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        connection = schema_editor.connection
        table = self._table(connection, to_state)
        if table is None:
            return
        now = database_now(connection.alias)
        if partition_sql.recorded_interval(connection, table) is None:
            for sql in partition_sql.convert_statements(connection, table, self.width, now):
                schema_editor.execute(sql, params=None)
        _, statements = partition_sql.ensure_statements(
            connection,
            table,
            self.width,
            now,
            now + partition_sql.horizon(self.width, outbox_settings().prune_every_minutes),
            partition_sql.partitions(connection, table),
        )
        for sql in statements:
            schema_editor.execute(sql, params=None)

    def database_backwards(
        self, app_label: str, schema_editor: Any, from_state: Any, to_state: Any
    ) -> None:
        connection = schema_editor.connection
        table = self._table(connection, from_state)
        if table is None or partition_sql.recorded_interval(connection, table) is None:
            return
        for sql in partition_sql.revert_statements(connection, table):
            schema_editor.execute(sql, params=None)

    def describe(self) -> str:
        return f"Partition the outbox archive by outcome and time ({self.interval})"

    @property
    def migration_name_fragment(self) -> str:
        return "partition_outbox_archive"

    def _table(self, connection: Any, state: Any) -> str | None:
        """The archive's table when it lives on *connection*'s PostgreSQL database."""
        try:
            model = state.apps.get_model("django_outbox", "ArchivedEvent")
        except LookupError:
            raise ValueError(
                "PartitionArchive: the migration must depend on django_outbox's latest "
                "migration, e.g. ('django_outbox', '0001_initial')."
            ) from None
        if connection.vendor != "postgresql":
            return None
        if not router.allow_migrate_model(connection.alias, model):
            return None
        return model._meta.db_table

"""System checks for the ``DJANGO_OUTBOX`` setting and the django-q2 cluster it runs on.

Ids are stable and grouped: E00x the settings' shape, E01x handlers, E02x buffer
models, E03x option values, E04x django-q2, E05x the ``STAGING`` and ``IDEMPOTENCY``
sections, E09x the partitioned archive (database checks: ``migrate`` and
``check --database`` run them), W00x warnings.
"""

from __future__ import annotations

import sys
from datetime import timedelta
from types import FrameType
from typing import Any

import django
from django.apps import apps
from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.core.management.commands.migrate import Command as MigrateCommand
from django.db import DatabaseError, connections, router
from django.db.migrations.loader import MigrationLoader
from django.utils.module_loading import import_string

from django_outbox.archive.partitions import archive_partitioning
from django_outbox.archive.replay import archive_databases
from django_outbox.base import moved
from django_outbox.base.dialect import database_now, supported
from django_outbox.base.option_table import (
    OptionTable,
    Problem,
    is_positive_int,
    is_positive_number,
)
from django_outbox.base.routing import on_database
from django_outbox.conf import (
    GLOBAL_OPTIONS,
    IDEMPOTENCY_OPTIONS,
    REMOVED_STREAM_OPTIONS,
    RENAMED_STREAM_OPTIONS,
    SETTING_NAME,
    STAGING_OPTIONS,
    STREAM_NAME,
    STREAM_OPTIONS,
    StagingConfig,
    current_names,
    outbox_settings,
    raw_settings,
    stream_databases,
)
from django_outbox.models import BufferEvent, OutboxEvent, StagedJob
from django_outbox.transport import handoff
from django_outbox.transport.handoff import cluster_options


def errors_of(problems: list[Problem], **extra: Any) -> list[CheckMessage]:
    """The system-check errors of an option table's problems."""
    return [Error(p.message, hint=p.hint, id=f"django_outbox.{p.check}", **extra) for p in problems]


@register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    raw = raw_settings()
    if not isinstance(raw, dict):
        return [
            Error(
                f"{SETTING_NAME} must be a dict, not {type(raw).__name__}.",
                hint=f'Set {SETTING_NAME} = {{"STREAMS": {{...}}}} in your settings.',
                id="django_outbox.E001",
            )
        ]
    errors: list[CheckMessage] = []
    unknown = GLOBAL_OPTIONS.unknown_problems(raw, where=SETTING_NAME, check="E002", noun="keys")
    errors.extend(errors_of(unknown))
    errors.extend(errors_of(GLOBAL_OPTIONS.problems(raw, lambda name: f"{SETTING_NAME}['{name}']")))
    errors.extend(_check_staging(raw.get("STAGING", {})))
    errors.extend(_check_section("IDEMPOTENCY", raw.get("IDEMPOTENCY", {}), IDEMPOTENCY_OPTIONS))
    streams = raw.get("STREAMS", {})
    if not isinstance(streams, dict):
        errors.append(
            Error(
                f"{SETTING_NAME}['STREAMS'] must be a dict of stream name to options, "
                f"not {type(streams).__name__}.",
                hint='For example {"marketing": {"HANDLER": "crm.outbox.sync"}}.',
                id="django_outbox.E003",
            )
        )
        return errors
    models_seen: dict[str, str] = {}
    for name, options in streams.items():
        errors.extend(_check_stream(name, options, models_seen))
    return errors


def _check_stream(name: Any, options: Any, models_seen: dict[str, str]) -> list[CheckMessage]:
    where = f"{SETTING_NAME}['STREAMS'][{name!r}]"
    errors: list[CheckMessage] = []
    if not isinstance(name, str) or not STREAM_NAME.match(name):
        errors.append(
            Error(
                f"Invalid stream name {name!r}.",
                hint="Use 1 to 64 lowercase letters, digits, '_' or '-', starting with a "
                "letter or digit.",
                id="django_outbox.E004",
            )
        )
    if not isinstance(options, dict):
        errors.append(
            Error(
                f"{where} must be a dict of options, not {type(options).__name__}.",
                hint='For example {"HANDLER": "crm.outbox.sync", "BATCH_SIZE": 1000}.',
                id="django_outbox.E005",
            )
        )
        return errors
    unknown = STREAM_OPTIONS.unknown_problems(
        options,
        where=where,
        check="E006",
        also=(*REMOVED_STREAM_OPTIONS, *RENAMED_STREAM_OPTIONS),
    )
    errors.extend(errors_of(unknown))
    for option in sorted(set(options) & set(RENAMED_STREAM_OPTIONS)):
        new = RENAMED_STREAM_OPTIONS[option]
        used = "ignored: the stream gives both" if new in options else f"used as {new}"
        errors.append(
            Warning(
                f"{where}['{option}'] is now called {new!r}; its value is {used}.",
                hint=f"Rename {option} to {new} (the old name works in 0.1 only).",
                id="django_outbox.W008",
            )
        )
    options = current_names(options)
    for option in sorted(set(options) & set(REMOVED_STREAM_OPTIONS)):
        errors.append(
            Warning(
                f"{where}['{option}'] is no longer used: it is ignored.",
                hint=REMOVED_STREAM_OPTIONS[option],
                id="django_outbox.W003",
            )
        )
    errors.extend(_check_handler(where, options.get("HANDLER")))
    if options.get("ON_EXHAUSTED") is not None:
        errors.extend(_check_callable_path(where, "ON_EXHAUSTED", options["ON_EXHAUSTED"]))
    errors.extend(
        _check_model(
            name,
            where,
            options.get("MODEL", STREAM_OPTIONS.defaults["MODEL"]),
            models_seen,
            options.get("DATABASE"),
        )
    )
    if options.get("ORDER_KEY") is not None:
        errors.extend(
            _check_order_key(
                where, options.get("MODEL", STREAM_OPTIONS.defaults["MODEL"]), options["ORDER_KEY"]
            )
        )
    merged = STREAM_OPTIONS.merged(options)
    errors.extend(
        errors_of(STREAM_OPTIONS.problems(options, lambda option: f"{where}['{option}']"))
    )
    if (
        is_positive_int(merged["BACKOFF_SECONDS"])
        and is_positive_int(merged["BACKOFF_MAX_SECONDS"])
        and merged["BACKOFF_MAX_SECONDS"] < merged["BACKOFF_SECONDS"]
    ):
        errors.append(
            Error(
                f"{where}['BACKOFF_MAX_SECONDS'] ({merged['BACKOFF_MAX_SECONDS']}) is below "
                f"BACKOFF_SECONDS ({merged['BACKOFF_SECONDS']}).",
                hint="The cap of the backoff must be at least its base.",
                id="django_outbox.E033",
            )
        )
    errors.extend(_check_cluster(name, where, merged))
    errors.extend(_check_database(where, options.get("DATABASE")))
    return errors


def _check_database(where: str, alias: Any) -> list[CheckMessage]:
    """``DATABASE`` is None or an alias of ``settings.DATABASES``."""
    if alias is None or (isinstance(alias, str) and alias in settings.DATABASES):
        return []
    return [
        Error(
            f"{where}['DATABASE'] must name a database of settings.DATABASES, not {alias!r}.",
            hint="Remove it to keep the stream on the database the router picks for its "
            f"buffer model, or give one of {sorted(settings.DATABASES)}.",
            id="django_outbox.E025",
        )
    ]


def _check_section(section: str, options: Any, table: OptionTable) -> list[CheckMessage]:
    """Shape, unknown keys and values of a ``STAGING``-like section."""
    where = f"{SETTING_NAME}[{section!r}]"
    known = f"Known options: {', '.join(sorted(table.by_name))}."
    if not isinstance(options, dict):
        return [
            Error(
                f"{where} must be a dict of options, not {type(options).__name__}.",
                hint=known,
                id="django_outbox.E050",
            )
        ]
    problems = table.unknown_problems(options, where=where, check="E051")
    problems += table.problems(options, lambda option: f"{where}['{option}']")
    return errors_of(problems)


def _check_staging(options: Any) -> list[CheckMessage]:
    errors = _check_section("STAGING", options, STAGING_OPTIONS)
    if not isinstance(options, dict):
        return errors
    where = f"{SETTING_NAME}['STAGING']"
    merged = STAGING_OPTIONS.merged(options)
    cluster = merged["CLUSTER"]
    if not STAGING_OPTIONS.by_name["CLUSTER"].kind.test(cluster):
        return errors
    timeout = (cluster_options(cluster) or {}).get("timeout")
    budget = merged["DRAIN_SECONDS"]
    if isinstance(timeout, (int, float)) and is_positive_int(budget) and budget >= timeout:
        errors.append(
            Error(
                f"{where}['DRAIN_SECONDS'] ({budget}) is not below the django-q2 timeout "
                f"({timeout}) of the cluster that runs the drain schedule.",
                hint="Lower DRAIN_SECONDS, or raise the cluster's timeout: the scheduled drain "
                "must end before django-q2 kills it.",
                id="django_outbox.E056",
            )
        )
    errors.extend(_check_redelivery(where, merged))
    return errors


def _check_redelivery(where: str, merged: dict[str, Any]) -> list[CheckMessage]:
    """``REDELIVER_SECONDS`` above the timeout of every cluster a staged job may run on.

    With a broker that can lose jobs (not django-q2's ORM broker on the staged jobs'
    database) a row still there ``REDELIVER_SECONDS`` after its forward is forwarded
    again: only after django-q2's ``timeout`` is a delivery surely over (run, failed or
    killed), so a shorter wait forwards jobs that still wait in a cluster or run there,
    each forward counted against ``MAX_FORWARDS``.
    """
    redeliver = merged["REDELIVER_SECONDS"]
    staging = StagingConfig.from_options(merged)
    if not (staging.enabled and is_positive_int(redeliver)):
        return []
    if handoff.in_transaction_hand_off(router.db_for_write(StagedJob)):
        return []
    q_cluster = getattr(settings, "Q_CLUSTER", {})
    alt = q_cluster.get("ALT_CLUSTERS") if isinstance(q_cluster, dict) else None
    clusters = [None, *(sorted(alt) if isinstance(alt, dict) else [])]
    errors: list[CheckMessage] = []
    for cluster in clusters:
        timeout = (cluster_options(cluster) or {}).get("timeout")
        if is_positive_number(timeout) and redeliver <= timeout:
            label = f"cluster {cluster!r}" if cluster else "Q_CLUSTER"
            errors.append(
                Error(
                    f"{where}['REDELIVER_SECONDS'] ({redeliver}) does not exceed the "
                    f"django-q2 timeout ({timeout}) of {label}.",
                    hint="Raise REDELIVER_SECONDS above the longest timeout of the clusters "
                    "staged jobs run on, or lower that timeout: with a broker that can lose "
                    "jobs, a staged job is forwarded again after REDELIVER_SECONDS, and only "
                    "after the timeout is its delivery surely over.",
                    id="django_outbox.E057",
                )
            )
    return errors


def _check_handler(where: str, path: Any) -> list[CheckMessage]:
    if not path:
        return [
            Error(
                f"{where} has no HANDLER.",
                hint="Set HANDLER to the dotted path of a callable that takes a Batch, "
                "for example 'crm.outbox.sync_activities'.",
                id="django_outbox.E010",
            )
        ]
    return _check_callable_path(where, "HANDLER", path)


#: Check ids of (cannot be imported, not a callable's dotted path), per option.
CALLABLE_IDS = {"HANDLER": ("E011", "E012"), "ON_EXHAUSTED": ("E013", "E014")}


def _check_callable_path(where: str, option: str, path: Any) -> list[CheckMessage]:
    import_id, callable_id = CALLABLE_IDS[option]
    try:
        target = import_string(path) if isinstance(path, str) else path
    except ImportError as exc:
        return [
            Error(
                f"{where}['{option}'] {path!r} cannot be imported: {exc}",
                hint="Check the dotted path and that its module imports without errors.",
                id=f"django_outbox.{import_id}",
            )
        ]
    if not isinstance(path, str) or not callable(target):
        return [
            Error(
                f"{where}['{option}'] must be the dotted path of a callable, not {path!r}.",
                hint="Give a string such as 'crm.outbox.sync_activities'.",
                id=f"django_outbox.{callable_id}",
            )
        ]
    return []


def _check_model(
    name: Any, where: str, label: Any, models_seen: dict[str, str], database: Any = None
) -> list[CheckMessage]:

    try:
        model = apps.get_model(label)
    except (LookupError, ValueError, TypeError, AttributeError):
        return [
            Error(
                f"{where}['MODEL'] {label!r} is not an installed model.",
                hint="Give 'app_label.ModelName' of a BufferEvent subclass in an installed app.",
                id="django_outbox.E020",
            )
        ]
    if not issubclass(model, BufferEvent):
        return [
            Error(
                f"{where}['MODEL'] {label!r} is not a buffer model.",
                hint="Subclass django_outbox.models.BufferEvent, which carries the group_id "
                "column and the two buffer indexes.",
                id="django_outbox.E021",
            )
        ]
    if model is not OutboxEvent:
        # One stream per model on each database: streams with distinct DATABASEs may share
        # a model (a table of the same shape on each shard of a sharded application).
        other = models_seen.setdefault(f"{model._meta.label} {database!r}", str(name))
        if other != name:
            return [
                Error(
                    f"{model._meta.label} is bound to two streams: {other!r} and {name!r}.",
                    hint="A custom buffer model belongs to one stream on each database; give "
                    "the other stream its own model or DATABASE, or use the generic "
                    "django_outbox.OutboxEvent.",
                    id="django_outbox.E022",
                )
            ]
    return []


#: Buffer columns that cannot order a stream: each row has its own, or the engine's.
_NOT_ORDER_KEYS = ("id", "group_id", "created_at")


def _check_order_key(where: str, label: Any, key: Any) -> list[CheckMessage]:
    """``ORDER_KEY`` names a column of the stream's own buffer model (E023)."""
    try:
        model = apps.get_model(label)
    except (LookupError, ValueError, TypeError, AttributeError):
        return []  # E020 reports the model
    if not isinstance(model, type) or not issubclass(model, BufferEvent):
        return []  # E021
    if model is OutboxEvent:
        if isinstance(key, str) and key:
            return []  # a top-level key of the payloads: publish() writes its value
        return [
            Error(
                f"{where}['ORDER_KEY'] {key!r} is not the name of a payload key.",
                hint="On the generic OutboxEvent buffer, ORDER_KEY names a top-level key of "
                "the payloads whose value groups the rows that must stay in order, for "
                'example "order_id"; publish() and publish_many() store its value.',
                id="django_outbox.E023",
            )
        ]
    field = None
    if isinstance(key, str):
        try:
            field = model._meta.get_field(key)
        except Exception:
            field = None
    if field is None or getattr(field, "column", None) is None or key in _NOT_ORDER_KEYS:
        return [
            Error(
                f"{where}['ORDER_KEY'] {key!r} is not a field of {model._meta.label}.",
                hint="Give the name of a field of the stream's buffer model whose value "
                "groups the rows that must stay in order (an aggregate's id, say); "
                "docs/how-to/ordered-streams.md shows the model.",
                id="django_outbox.E023",
            )
        ]
    return []


def _check_cluster(name: Any, where: str, merged: dict[str, Any]) -> list[CheckMessage]:
    cluster = merged["CLUSTER"] if isinstance(merged["CLUSTER"], str) else None
    options = cluster_options(cluster)
    if options is None:
        return [
            Warning(
                f"{where}['CLUSTER'] names {cluster!r}, which Q_CLUSTER['ALT_CLUSTERS'] "
                "does not define.",
                hint="Add it to Q_CLUSTER['ALT_CLUSTERS'] and run a qcluster with "
                f"Q_CLUSTER_NAME={cluster}, or remove CLUSTER.",
                id="django_outbox.W002",
            )
        ]
    label = f"cluster {cluster!r}" if cluster else "Q_CLUSTER"
    timeout, retry = options.get("timeout"), options.get("retry", 60)
    errors: list[CheckMessage] = []
    if not isinstance(timeout, (int, float)) or timeout >= retry:
        errors.append(
            Error(
                f"The django-q2 {label} used by stream {name!r} has timeout={timeout!r}, "
                f"which is not below retry={retry!r}.",
                hint="Set Q_CLUSTER['timeout'] below Q_CLUSTER['retry'] so django-q2 never "
                "hands a job that is still running to a second worker.",
                id="django_outbox.E041",
            )
        )
    lease = merged["LEASE_SECONDS"]
    beats = merged["AUTO_HEARTBEAT"] is not False  # the lease outlives a long handler
    if (
        not beats
        and isinstance(timeout, (int, float))
        and is_positive_int(lease)
        and timeout > lease
    ):
        errors.append(
            Error(
                f"The django-q2 {label} used by stream {name!r} has timeout={timeout!r}, "
                f"longer than the stream's LEASE_SECONDS={lease}.",
                hint="Raise LEASE_SECONDS to at least the timeout, lower the timeout, or turn "
                "AUTO_HEARTBEAT back on: a lease that expires while its handler may still "
                "run lets a second worker take the group over.",
                id="django_outbox.E042",
            )
        )
    return errors


@register()
def check_moved_imports(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """W009: a module was imported by the path it had before this release's layout."""
    return [
        Warning(
            f"{old} moved to {new}: the old path works in 0.1 only.",
            hint=f"Import {new} instead (in migration files too, where makemigrations "
            "wrote the old path).",
            id="django_outbox.W009",
        )
        for old, new in moved.USED.items()
    ]


@register()
def check_django_q(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    if apps.is_installed("django_q"):
        return []
    return [
        Error(
            "django_q is not in INSTALLED_APPS.",
            hint="django_outbox runs its jobs on django-q2: add 'django_q' to INSTALLED_APPS.",
            id="django_outbox.E040",
        )
    ]


#: The app of the ``django.tasks`` backend, and the prefix of its dotted paths.
TASKS_APP = "django_outbox.tasks_backend"


def names_tasks_backend(params: Any) -> bool:
    """Whether a ``TASKS`` entry's ``BACKEND`` is a dotted path into :data:`TASKS_APP`.

    Read from the path, not by importing it: imported while its app is not installed,
    the backend's model would join django_outbox's app (and its migrations).
    """
    path = params.get("BACKEND") if isinstance(params, dict) else None
    return isinstance(path, str) and path.startswith(f"{TASKS_APP}.")


def tasks_app_missing(alias: str) -> Error:
    """E084 for the ``TASKS`` alias *alias*."""
    return Error(
        f"TASKS[{alias!r}] uses OutboxTaskBackend, but {TASKS_APP} is not in INSTALLED_APPS.",
        hint=f'Add "{TASKS_APP}" to INSTALLED_APPS (after "django_outbox") and run migrate: '
        "it holds the task table.",
        id="django_outbox.E084",
    )


@register()
def check_tasks_app(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """E084 from a plain ``check``: Django registers the task backends' own checks only
    once ``django.tasks`` is imported, which nothing does while the app is missing."""
    tasks = getattr(settings, "TASKS", None)
    if django.VERSION < (6, 0) or apps.is_installed(TASKS_APP) or not isinstance(tasks, dict):
        return []  # before Django 6.0 no TASKS setting is read
    return [
        tasks_app_missing(alias) for alias, params in tasks.items() if names_tasks_backend(params)
    ]


@register()
def check_sqlite_transactions(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    warnings: list[CheckMessage] = []
    for alias in connections:
        dialect = supported(connections[alias])
        if dialect is None or not dialect.serializes_writers:
            continue
        connection = connections[alias]
        mode = connection.settings_dict.get("OPTIONS", {}).get("transaction_mode")
        if str(mode).upper() != "IMMEDIATE":
            warnings.append(
                Warning(
                    f"SQLite database {alias!r} does not use IMMEDIATE transactions.",
                    hint=f'Set DATABASES[{alias!r}]["OPTIONS"]["transaction_mode"] = '
                    '"IMMEDIATE" so concurrent workers claim groups one at a time instead '
                    "of failing with 'database is locked'.",
                    id="django_outbox.W001",
                )
            )
    return warnings


@register(Tags.database)
def check_stream_databases(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[CheckMessage]:
    """Each stream's database has the library's tables: its migrations are all applied.

    Not from the checks ``migrate`` runs before it applies them: a warning that tells
    the user to run the command they are running is noise (``migrate`` reports a
    database it cannot read itself).
    """
    messages: list[CheckMessage] = []
    if _checked_by_migrate():
        return messages
    for alias, streams in stream_databases().items():
        if not databases or alias not in databases or alias not in settings.DATABASES:
            continue
        try:
            missing = unapplied_migrations(connections[alias])
        except DatabaseError as exc:
            messages.append(
                Warning(
                    f"Could not read the migrations of database {alias!r} (streams "
                    f"{', '.join(streams)}): {str(exc).strip().splitlines()[0]}",
                    hint="Its tables were not checked; run the check again once the "
                    "database answers.",
                    id="django_outbox.W007",
                )
            )
            continue
        if missing:
            messages.append(
                Warning(
                    f"Database {alias!r} holds streams {', '.join(streams)} but lacks "
                    f"migrations of django_outbox ({', '.join(missing)}): their groups, "
                    "state and archive have no tables there.",
                    hint=f"Run: manage.py migrate django_outbox --database {alias} (and let "
                    "your router allow django_outbox on it).",
                    id="django_outbox.W006",
                )
            )
    return messages


def _checked_by_migrate() -> bool:
    """Whether these checks run inside ``migrate`` (Django's or a subclass of it).

    ``migrate`` calls the checks with the same arguments as ``check --database``: only
    the command on the stack tells them apart.
    """
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if isinstance(frame.f_locals.get("self"), MigrateCommand):
            return True
        frame = frame.f_back
    return False


def unapplied_migrations(connection: Any) -> list[str]:
    """The migrations of django_outbox not applied on *connection*, in order."""
    loader = MigrationLoader(connection, ignore_no_migrations=True)
    applied = loader.applied_migrations or {}
    missing: list[str] = []
    for leaf in loader.graph.leaf_nodes("django_outbox"):
        for node in loader.graph.forwards_plan(leaf):
            if node[0] == "django_outbox" and node not in applied and node[1] not in missing:
                missing.append(node[1])
    return missing


@register(Tags.database)
def check_archive_partitions(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[CheckMessage]:
    """A partitioned archive records a valid interval and has partitions for now and ahead,
    on every database that holds a stream's archive."""
    messages: list[CheckMessage] = []
    for alias in archive_databases():
        if databases and alias in databases:
            messages.extend(_check_archive_partitions(alias))
    return messages


def _check_archive_partitions(alias: str) -> list[CheckMessage]:
    prune = "Run manage.py outbox_prune (it creates the partitions ahead) and keep the "
    try:
        with on_database(alias):
            state = archive_partitioning()
    except DatabaseError:
        return []  # W007 reports a stream database that does not answer
    except ValueError as error:
        return [
            Error(
                f"The partitioned archive of database {alias!r} records no valid interval: {error}",
                hint="Set the comment of the archive table back with the migration "
                "operation PartitionArchive, or comment it "
                "'django_outbox partitioned archive, interval 1 day'.",
                id="django_outbox.E090",
            )
        ]
    if state is None:
        return []
    now = database_now(alias)
    soon = now + timedelta(minutes=outbox_settings().prune_every_minutes)
    messages: list[CheckMessage] = []
    for outcome in ("done", "failed"):
        partition = state.covering(outcome, now)
        if partition is None:
            messages.append(
                Error(
                    f"The partitioned archive of database {alias!r} has no partition for "
                    f"{outcome} rows archived now: finalizing a group of its streams fails "
                    "(their rows stay in the buffer) until one exists.",
                    hint=prune + "django_outbox:prune schedule running (outbox_schedules).",
                    id="django_outbox.E091",
                )
            )
            continue
        while partition is not None and partition.upper <= soon:
            partition = state.covering(outcome, partition.upper)
        if partition is None:
            messages.append(
                Warning(
                    f"The {outcome} partitions of the partitioned archive of database "
                    f"{alias!r} end before the next prune run is due.",
                    hint=prune + "django_outbox:prune schedule running (outbox_schedules).",
                    id="django_outbox.W004",
                )
            )
    return messages

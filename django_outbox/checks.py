"""System checks for the ``DJANGO_OUTBOX`` setting and the django-q2 cluster it runs on.

Ids are stable and grouped: E00x the settings' shape, E01x handlers, E02x buffer
models, E03x option values, E04x django-q2, E05x the ``STAGING`` and ``IDEMPOTENCY``
sections, W00x warnings.
"""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning, register
from django.db import connections
from django.utils.module_loading import import_string

from django_outbox.conf import (
    GLOBAL_DEFAULTS,
    IDEMPOTENCY_DEFAULTS,
    MAX_BATCH_SIZE,
    REMOVED_STREAM_OPTIONS,
    SETTING_NAME,
    STAGING_DEFAULTS,
    STREAM_DEFAULTS,
    STREAM_NAME,
)
from django_outbox.db.dialect import supported

POSITIVE_INT_OPTIONS = (
    "BATCH_SIZE",
    "CHAINS",
    "EVERY_MINUTES",
    "MAX_ATTEMPTS",
    "BACKOFF_SECONDS",
    "BACKOFF_MAX_SECONDS",
    "LEASE_SECONDS",
)
BOOL_OPTIONS = ("ARCHIVE", "TRANSACTIONAL")


def _is_positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


@register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    raw = getattr(settings, SETTING_NAME, {})
    if not isinstance(raw, dict):
        return [
            Error(
                f"{SETTING_NAME} must be a dict, not {type(raw).__name__}.",
                hint=f'Set {SETTING_NAME} = {{"STREAMS": {{...}}}} in your settings.',
                id="django_outbox.E001",
            )
        ]
    errors: list[CheckMessage] = []
    unknown = sorted(set(raw) - set(GLOBAL_DEFAULTS))
    if unknown:
        errors.append(
            Error(
                f"{SETTING_NAME} has unknown keys: {', '.join(unknown)}.",
                hint=f"Known keys: {', '.join(sorted(GLOBAL_DEFAULTS))}.",
                id="django_outbox.E002",
            )
        )
    retention = raw.get("ARCHIVE_RETENTION_DAYS", GLOBAL_DEFAULTS["ARCHIVE_RETENTION_DAYS"])
    if not _is_positive_int(retention):
        errors.append(
            Error(
                f"{SETTING_NAME}['ARCHIVE_RETENTION_DAYS'] must be a positive integer, "
                f"not {retention!r}.",
                hint="Give the number of days archived rows are kept, for example 30.",
                id="django_outbox.E034",
            )
        )
    failed_retention = raw.get(
        "ARCHIVE_FAILED_RETENTION_DAYS", GLOBAL_DEFAULTS["ARCHIVE_FAILED_RETENTION_DAYS"]
    )
    if not _is_positive_int(failed_retention):
        errors.append(
            Error(
                f"{SETTING_NAME}['ARCHIVE_FAILED_RETENTION_DAYS'] must be a positive integer, "
                f"not {failed_retention!r}.",
                hint="Give the number of days dead letters are kept for replay, for example 90.",
                id="django_outbox.E038",
            )
        )
    every = raw.get("PRUNE_EVERY_MINUTES", GLOBAL_DEFAULTS["PRUNE_EVERY_MINUTES"])
    if not _is_positive_int(every):
        errors.append(
            Error(
                f"{SETTING_NAME}['PRUNE_EVERY_MINUTES'] must be a positive integer, not {every!r}.",
                hint="Give the minutes between two runs of the prune schedule, for example "
                "1440 (daily).",
                id="django_outbox.E035",
            )
        )
    token = raw.get("METRICS_TOKEN")
    if token is not None and not (isinstance(token, str) and len(token) >= 16):
        errors.append(
            Error(
                f"{SETTING_NAME}['METRICS_TOKEN'] must be None or a string of at least 16 "
                "characters.",
                hint="Generate one with: python -c 'import secrets; print(secrets.token_urlsafe())'"
                " and read it from the environment, not from the source.",
                id="django_outbox.E036",
            )
        )
    errors.extend(_check_staging(raw.get("STAGING", {})))
    errors.extend(_check_section("IDEMPOTENCY", raw.get("IDEMPOTENCY", {}), IDEMPOTENCY_DEFAULTS))
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
    unknown = sorted(set(options) - set(STREAM_DEFAULTS) - set(REMOVED_STREAM_OPTIONS))
    if unknown:
        errors.append(
            Error(
                f"{where} has unknown options: {', '.join(unknown)}.",
                hint=f"Known options: {', '.join(sorted(STREAM_DEFAULTS))}.",
                id="django_outbox.E006",
            )
        )
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
        _check_model(name, where, options.get("MODEL", STREAM_DEFAULTS["MODEL"]), models_seen)
    )
    merged = {**STREAM_DEFAULTS, **options}
    for option in POSITIVE_INT_OPTIONS:
        if not _is_positive_int(merged[option]):
            errors.append(
                Error(
                    f"{where}['{option}'] must be a positive integer, not {merged[option]!r}.",
                    hint=f"Remove it to use the default ({STREAM_DEFAULTS[option]}) or give "
                    "a whole number greater than 0.",
                    id="django_outbox.E030",
                )
            )
    if _is_positive_int(merged["BATCH_SIZE"]) and merged["BATCH_SIZE"] > MAX_BATCH_SIZE:
        errors.append(
            Error(
                f"{where}['BATCH_SIZE'] is {merged['BATCH_SIZE']:,}, above the most a stream "
                f"may claim at once ({MAX_BATCH_SIZE:,}).",
                hint="One claim locks and one handler call holds that many rows: give at most "
                f"{MAX_BATCH_SIZE:,} (a few hundred to a few thousand is usual).",
                id="django_outbox.E039",
            )
        )
    for option in ("ARCHIVE_RETENTION_DAYS", "ARCHIVE_FAILED_RETENTION_DAYS"):
        if merged[option] is not None and not _is_positive_int(merged[option]):
            errors.append(
                Error(
                    f"{where}['{option}'] must be a positive integer or None, "
                    f"not {merged[option]!r}.",
                    hint=f"Remove it to use the global {SETTING_NAME}['{option}'], or give the "
                    "number of days archived rows of this stream are kept.",
                    id="django_outbox.E037",
                )
            )
    for option in BOOL_OPTIONS:
        if not isinstance(merged[option], bool):
            errors.append(
                Error(
                    f"{where}['{option}'] must be True or False, not {merged[option]!r}.",
                    hint=f"Remove it to use the default ({STREAM_DEFAULTS[option]}).",
                    id="django_outbox.E031",
                )
            )
    cluster = merged["CLUSTER"]
    if cluster is not None and not (isinstance(cluster, str) and cluster):
        errors.append(
            Error(
                f"{where}['CLUSTER'] must be a django-q2 cluster name or None, not {cluster!r}.",
                hint="Use None for the default cluster or a name from Q_CLUSTER['ALT_CLUSTERS'].",
                id="django_outbox.E032",
            )
        )
    if (
        _is_positive_int(merged["BACKOFF_SECONDS"])
        and _is_positive_int(merged["BACKOFF_MAX_SECONDS"])
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
    return errors


SECTION_INT_OPTIONS = ("BATCH_SIZE", "EVERY_MINUTES", "DRAIN_SECONDS", "RETENTION_DAYS")
SECTION_BOOL_OPTIONS = ("FORWARD_ON_COMMIT",)


def _check_section(section: str, options: Any, defaults: dict[str, Any]) -> list[CheckMessage]:
    """Shape, unknown keys, integers and booleans of a ``STAGING``-like section."""
    where = f"{SETTING_NAME}[{section!r}]"
    if not isinstance(options, dict):
        return [
            Error(
                f"{where} must be a dict of options, not {type(options).__name__}.",
                hint=f"Known options: {', '.join(sorted(defaults))}.",
                id="django_outbox.E050",
            )
        ]
    errors: list[CheckMessage] = []
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        errors.append(
            Error(
                f"{where} has unknown options: {', '.join(unknown)}.",
                hint=f"Known options: {', '.join(sorted(defaults))}.",
                id="django_outbox.E051",
            )
        )
    merged = {**defaults, **options}
    for option in SECTION_INT_OPTIONS:
        if option in merged and not _is_positive_int(merged[option]):
            errors.append(
                Error(
                    f"{where}['{option}'] must be a positive integer, not {merged[option]!r}.",
                    hint=f"Remove it to use the default ({defaults[option]}) or give a whole "
                    "number greater than 0.",
                    id="django_outbox.E052",
                )
            )
    for option in SECTION_BOOL_OPTIONS:
        if option in merged and not isinstance(merged[option], bool):
            errors.append(
                Error(
                    f"{where}['{option}'] must be True or False, not {merged[option]!r}.",
                    hint=f"Remove it to use the default ({defaults[option]}).",
                    id="django_outbox.E053",
                )
            )
    return errors


def _check_staging(options: Any) -> list[CheckMessage]:
    errors = _check_section("STAGING", options, STAGING_DEFAULTS)
    if not isinstance(options, dict):
        return errors
    where = f"{SETTING_NAME}['STAGING']"
    allowed = options.get("ALLOWED_MODULES", [])
    if not isinstance(allowed, (list, tuple)) or not all(
        isinstance(prefix, str) and prefix.strip(".") for prefix in allowed
    ):
        errors.append(
            Error(
                f"{where}['ALLOWED_MODULES'] must be a list of module paths, not {allowed!r}.",
                hint="List the modules whose functions may be staged, for example "
                '["shop.tasks", "billing.jobs"].',
                id="django_outbox.E054",
            )
        )
    merged = {**STAGING_DEFAULTS, **options}
    cluster = merged["CLUSTER"]
    if cluster is not None and not (isinstance(cluster, str) and cluster):
        errors.append(
            Error(
                f"{where}['CLUSTER'] must be a django-q2 cluster name or None, not {cluster!r}.",
                hint="Use None for the default cluster or a name from Q_CLUSTER['ALT_CLUSTERS'].",
                id="django_outbox.E055",
            )
        )
        return errors
    cluster_options = _cluster_options(cluster)
    timeout = (cluster_options or {}).get("timeout")
    budget = merged["DRAIN_SECONDS"]
    if isinstance(timeout, (int, float)) and _is_positive_int(budget) and budget >= timeout:
        errors.append(
            Error(
                f"{where}['DRAIN_SECONDS'] ({budget}) is not below the django-q2 timeout "
                f"({timeout}) of the cluster that runs the drain schedule.",
                hint="Lower DRAIN_SECONDS, or raise the cluster's timeout: the scheduled drain "
                "must end before django-q2 kills it.",
                id="django_outbox.E056",
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
    name: Any, where: str, label: Any, models_seen: dict[str, str]
) -> list[CheckMessage]:
    from django_outbox.models import BufferEvent, OutboxEvent

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
        other = models_seen.setdefault(model._meta.label, str(name))
        if other != name:
            return [
                Error(
                    f"{model._meta.label} is bound to two streams: {other!r} and {name!r}.",
                    hint="A custom buffer model belongs to one stream; give the other stream "
                    "its own model or use the generic django_outbox.OutboxEvent.",
                    id="django_outbox.E022",
                )
            ]
    return []


def _cluster_options(cluster: str | None) -> dict[str, Any] | None:
    q_cluster = getattr(settings, "Q_CLUSTER", {})
    if not isinstance(q_cluster, dict):
        return None
    options = {k: v for k, v in q_cluster.items() if k != "ALT_CLUSTERS"}
    if cluster and cluster not in (q_cluster.get("name"), q_cluster.get("cluster_name")):
        alt = (q_cluster.get("ALT_CLUSTERS") or {}).get(cluster)
        if not isinstance(alt, dict):
            return None
        options.update(alt)
    return options


def _check_cluster(name: Any, where: str, merged: dict[str, Any]) -> list[CheckMessage]:
    cluster = merged["CLUSTER"] if isinstance(merged["CLUSTER"], str) else None
    options = _cluster_options(cluster)
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
    if isinstance(timeout, (int, float)) and _is_positive_int(lease) and timeout > lease:
        errors.append(
            Error(
                f"The django-q2 {label} used by stream {name!r} has timeout={timeout!r}, "
                f"longer than the stream's LEASE_SECONDS={lease}.",
                hint="Raise LEASE_SECONDS to at least the timeout, or lower the timeout: a "
                "lease that expires while its handler may still run lets a second worker "
                "take the group over.",
                id="django_outbox.E042",
            )
        )
    return errors


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

"""The options of a unique-job kind, declared in a nested ``class Job:`` on the model.

Options are declared once, in :data:`OPTIONS`, and read once per model class. They are
not validated here: the system checks in :mod:`django_outbox.unique.checks` report bad
values with a hint.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django_outbox.base.option_table import (
    BOOL,
    CLUSTER,
    FIELD_NAMES,
    OPTIONAL_FIELD_NAME,
    OPTIONAL_FIELD_NAMES,
    POSITIVE_INT,
    POSITIVE_NUMBER,
    Option,
    OptionTable,
    choice,
)
from django_outbox.conf import outage_seconds

if TYPE_CHECKING:
    from django_outbox.models.unique import UniqueJob

ORDERINGS = ("created", "ready")

OPTIONS = OptionTable(
    Option("unique_fields", (), FIELD_NAMES),  # E071 to E073
    Option("unique_while_executing", None, OPTIONAL_FIELD_NAMES),  # E071 to E073
    Option(
        "ordering",
        "created",
        choice(
            *ORDERINGS,
            hint="'created': jobs of a key run in creation order, each after the previous "
            "one finished; 'ready': the first ready job of a key runs first.",
        ),
        "E074",
    ),
    Option("max_attempts", 5, POSITIVE_INT, "E075"),
    Option("backoff_seconds", 10, POSITIVE_NUMBER, "E076"),
    Option("backoff_max_seconds", 3600, POSITIVE_NUMBER, "E076"),  # at least the base
    Option("concurrency", 10, POSITIVE_INT, "E075"),
    Option("chunk_size", 50, POSITIVE_INT, "E075"),
    Option("jobs_per_statement", 8, POSITIVE_INT, "E075"),
    Option("priority_field", None, OPTIONAL_FIELD_NAME),  # an integer field: E080
    Option("result_field", None, OPTIONAL_FIELD_NAME),  # a nullable JSONField: E081
    Option("workers_field", None, OPTIONAL_FIELD_NAME),  # a TextField: E082
    Option("nullable_keys", False, BOOL, "E083"),  # NULL key fields allowed (E073)
    Option("lease_seconds", 300, POSITIVE_INT, "E075"),
    Option("cluster", None, CLUSTER, "E077"),  # defined in Q_CLUSTER: E077
    Option("retention_days", 7, POSITIVE_INT, "E075"),
    Option("dispatch_every_minutes", 1, POSITIVE_INT, "E075"),
)
DEFAULTS = OPTIONS.defaults


@dataclass(frozen=True)
class KindOptions:
    """The effective options of one kind (its ``class Job:`` merged over the defaults).

    ``unique_fields`` make a job unique until a worker starts it (one job per key
    pending or dispatched); ``exclusive_fields`` (``unique_while_executing``, by default
    the unique fields) make it unique while executing (one running job per key) and
    relate jobs for ordering.
    With ``nullable_keys`` a job whose key holds a NULL has no key: it never conflicts
    with another job nor waits for one. ``result_field`` stores what ``perform()``
    returned (JSON), written by the statement that marks the job processed;
    ``workers_field`` collects the worker of every attempt, one per line.
    ``jobs_per_statement`` (8 by default) lets a chunk start that many jobs in one
    statement and record their successes with the next; a crash costs none of them an
    attempt (the database cannot tell which one was running), and each then runs alone,
    where a crash counts.
    """

    unique_fields: tuple[str, ...]
    exclusive_fields: tuple[str, ...]
    ordering: str
    max_attempts: int
    backoff_seconds: float
    backoff_max_seconds: float
    concurrency: int
    chunk_size: int
    jobs_per_statement: int
    priority_field: str | None
    result_field: str | None
    workers_field: str | None
    nullable_keys: bool
    lease_seconds: int
    cluster: str | None
    retention_days: int
    dispatch_every_minutes: int

    @property
    def outage_seconds(self) -> float:
        """How long a worker waits mid-chunk for the database to answer again
        (:func:`~django_outbox.conf.outage_seconds` of the lease)."""
        return outage_seconds(self.lease_seconds)

    @property
    def one_pending_per_exclusive_key(self) -> bool:
        """Whether jobs sharing an exclusive key can never be pending side by side.

        True when the unique fields are a non-empty subset of the exclusive fields: two
        jobs with the same exclusive key then have the same unique key too.
        """
        return bool(self.unique_fields) and set(self.unique_fields) <= set(self.exclusive_fields)


def keyless_fields(model: type[UniqueJob], names: Sequence[str] | None = None) -> list[str]:
    """The fields among *names* (the unique fields by default) that may hold NULL
    (``nullable_keys``): a job with a NULL there has no key, and no entry in the key's
    unique index."""
    options = kind_options(model)
    if not options.nullable_keys:
        return []
    names = options.unique_fields if names is None else names
    return [name for name in names if model._meta.get_field(name).null]


def declared_options(model: type[UniqueJob]) -> dict[str, Any]:
    """Return the public attributes of the model's ``class Job:`` (inherited ones too)."""
    job = getattr(model, "Job", None)
    if job is None:
        return {}
    return {name: getattr(job, name) for name in dir(job) if not name.startswith("_")}


def _names(value: Any) -> tuple[str, ...]:
    if isinstance(value, (list, tuple)) and all(isinstance(item, str) for item in value):
        return tuple(value)
    return ()  # malformed: reported by check E071


def kind_options(model: type[UniqueJob]) -> KindOptions:
    """Return *model*'s effective options, cached on the class.

    A kind whose options come partly from settings (the task records of the
    ``django.tasks`` backend) defines a ``configured_job_options()`` classmethod; those
    values are validated by that feature's own checks.
    """
    cached = model.__dict__.get("_kind_options")
    if cached is not None:
        return cached
    configured = getattr(model, "configured_job_options", None)
    values = OPTIONS.effective({**declared_options(model), **(configured() if configured else {})})
    unique = _names(values["unique_fields"])
    exclusive = values.pop("unique_while_executing")
    values["unique_fields"] = unique
    values["exclusive_fields"] = unique if exclusive is None else _names(exclusive)
    options = KindOptions(**values)
    model._kind_options = options
    return options

"""Unique jobs: one table per job kind, declared by subclassing :class:`UniqueJob`.

A kind's rows are its jobs. The state machine::

    pending --dispatch--> running, not started (lease, attempt n, started_at NULL)
    running, not started --a worker starts it--> running (started_at set)
    running, not started --lease expired, or handed back--> pending (attempt not counted)
    running --perform() returned--> processed
    running --perform() raised--> pending (process_after = now + backoff)  … or failed
    running --lease expired--> pending (rescued by dispatch, the attempt counted) … or failed
    running in a group of several --lease expired--> pending (attempt not counted, alone next)

Every start gives the job a fresh fencing ``token`` (the jobs one statement starts share
it): a worker's finish, heartbeat and failure match the token, not the attempt, since a
job handed back uncounted runs the same attempt number again.

A dispatched job that no worker started yet is shown as *dispatched* (:data:`STAGES`):
it still holds its unique key.

Uniqueness is enforced by partial unique indexes, generated from the kind's options
when the model class is prepared, so ``makemigrations`` writes them into the app's
migration: one over the unique fields among jobs not started (:data:`UNSTARTED`: unique
until a worker starts the job) and one over the exclusive fields among running jobs
(unique while executing).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any, ClassVar

from asgiref.sync import sync_to_async
from django.apps import apps
from django.db import models
from django.db.backends.utils import names_digest
from django.db.models import Q, QuerySet
from django.db.models.functions import Now
from django.db.models.signals import class_prepared
from django.dispatch import receiver

from django_outbox.unique.options import KindOptions, keyless_fields, kind_options

__all__ = [
    "JobState",
    "UniqueJob",
    "all_kinds",
    "get_kind",
]


class JobState(models.TextChoices):
    PENDING = "pending", "pending"
    RUNNING = "running", "running"
    PROCESSED = "processed", "processed"
    FAILED = "failed", "failed"


_FINISHED = (JobState.PROCESSED, JobState.FAILED)

#: Jobs no worker has started: pending, or dispatched (running with ``started_at`` NULL:
#: handed to the broker, leased, waiting for its worker). One per unique key at most
#: (the unique index's condition, and ``JobTable``'s ``UNSTARTED_SQL`` says the same).
UNSTARTED = Q(state=JobState.PENDING) | Q(state=JobState.RUNNING, started_at__isnull=True)

#: What a job is doing, as the admin, the counts and the metrics show it: the states,
#: with the running jobs split into dispatched (not started) and running (started).
_DISPATCHED = "dispatched"
STAGES = {
    JobState.PENDING.value: Q(state=JobState.PENDING),
    _DISPATCHED: Q(state=JobState.RUNNING, started_at__isnull=True),
    JobState.RUNNING.value: Q(state=JobState.RUNNING, started_at__isnull=False),
    JobState.PROCESSED.value: Q(state=JobState.PROCESSED),
    JobState.FAILED.value: Q(state=JobState.FAILED),
}


def stage_of(job: UniqueJob) -> str:
    """The job's stage (a key of :data:`STAGES`): its state, or ``dispatched``."""
    if job.state == JobState.RUNNING and job.started_at is None:
        return _DISPATCHED
    return str(job.state)


#: The fields every kind has, set by django_outbox: never payload, never a unique field.
BOOKKEEPING_FIELDS = (
    "id",
    "state",
    "attempt",
    "token",
    "process_after",
    "lease_expires_at",
    "created_at",
    "started_at",
    "finished_at",
    "last_error",
    "worker",
    "trace_context",
)


class UniqueJob(models.Model):
    """Abstract base of a job kind. Subclass it, add payload fields and override ``perform``.

    Options go in a nested ``class Job:`` (see the README, "Unique jobs")::

        class RebuildBlogFeed(UniqueJob):
            blog = models.ForeignKey(Blog, on_delete=models.CASCADE)

            class Job:
                unique_fields = ["blog"]
                max_attempts = 5

            def perform(self, heartbeat):
                ...

    Create jobs with ``RebuildBlogFeed.enqueue(blog=blog)``, never with ``create()``:
    ``enqueue`` is what keeps one job per key waiting to start.
    """

    #: The effective options, cached on each kind by :func:`kind_options`.
    _kind_options: ClassVar[KindOptions]

    id = models.BigAutoField(primary_key=True)
    state = models.CharField(
        max_length=16, choices=JobState.choices, default=JobState.PENDING, editable=False
    )
    attempt = models.PositiveIntegerField(
        default=0, editable=False, help_text="Attempts started so far."
    )
    token = models.BigIntegerField(
        default=0,
        db_default=0,
        editable=False,
        help_text="The fencing token of the job's last start: fresh on every start, shared "
        "by the jobs one statement started.",
    )
    process_after = models.DateTimeField(
        db_default=Now(), help_text="Not started before this time (database clock)."
    )
    lease_expires_at = models.DateTimeField(null=True, blank=True, editable=False)
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    started_at = models.DateTimeField(null=True, blank=True, editable=False)
    finished_at = models.DateTimeField(null=True, blank=True, editable=False)
    last_error = models.TextField(blank=True, default="", editable=False)
    worker = models.CharField(max_length=255, blank=True, default="", editable=False)
    #: The W3C ``traceparent`` of the span that enqueued the job (OpenTelemetry), if one
    #: was recording: the job runs in a child of it (:meth:`trace_span`).
    trace_context = models.CharField(  # noqa: DJ001 (NULL: no trace, as on buffer rows)
        max_length=55, null=True, blank=True, editable=False
    )

    class Meta:
        abstract = True

    def __str__(self) -> str:
        return f"{self._meta.label} #{self.pk} ({self.state}, attempt {self.attempt})"

    def perform(self, heartbeat: Callable[[], None]) -> Any:
        """Do the job's work. Override it.

        Call ``heartbeat()`` more often than every ``lease_seconds`` when the work may
        take longer: it extends the lease and raises ``LeaseLost`` when another worker
        took the job over, and then you must stop without further side effects.
        Raising any other exception fails this attempt (retried with backoff).
        """
        raise NotImplementedError(
            f"{type(self).__name__} must override perform(self, heartbeat) with its work."
        )

    def trace_span(self) -> tuple[str, dict[str, Any]]:
        """The name and attributes of the span ``perform()`` runs in (OpenTelemetry).

        The span is a child of the one that enqueued the job (``trace_context``). A kind
        may override it to name its spans after what its jobs do.
        """
        label = self._meta.label
        return f"django_outbox.job {label}", {
            "django_outbox.kind": label,
            "django_outbox.job_id": str(self.pk),
            "django_outbox.attempt": self.attempt,
        }

    @classmethod
    def job_options(cls) -> KindOptions:
        """The kind's effective options."""
        return kind_options(cls)

    @classmethod
    def enqueue(
        cls, *, process_after: datetime | timedelta | None = None, **fields: Any
    ) -> tuple[UniqueJob, bool]:
        """Create a job unless an equivalent one has not started; return ``(job, created)``.

        Equivalent means the same values of the unique fields; not started means pending,
        or dispatched to a worker that has not started it yet. That job is returned
        unchanged (its other fields and its ``process_after`` are kept).
        *process_after* (an aware datetime, or a delay from the database's now) holds
        the job back. One ``INSERT … ON CONFLICT DO NOTHING`` in the caller's
        transaction; dispatch is kicked right after it commits.
        """
        from django_outbox.unique.enqueue import enqueue

        return enqueue(cls, fields, process_after=process_after)

    @classmethod
    def enqueue_many(
        cls,
        items: Iterable[dict[str, Any]],
        *,
        process_after: datetime | timedelta | None = None,
    ) -> list[UniqueJob]:
        """Create a job for each dict of fields, in bulk; return the jobs created.

        An item whose unique key has a job not started yet (or an earlier item with the
        same key) creates nothing. One ``INSERT … ON CONFLICT DO NOTHING`` per 1,000 items in
        the caller's transaction; dispatch is kicked once, after it commits.
        """
        from django_outbox.unique.enqueue import enqueue_many

        return enqueue_many(cls, items, process_after=process_after)

    @classmethod
    async def aenqueue(
        cls, *, process_after: datetime | timedelta | None = None, **fields: Any
    ) -> tuple[UniqueJob, bool]:
        """:meth:`enqueue` from async code; return ``(job, created)``.

        Runs ``enqueue()`` with ``sync_to_async(thread_sensitive=True)``, on the
        connection of the thread where the request's thread-sensitive work runs: on its
        own it commits at once (autocommit) and the commit kicks the dispatch. To enqueue
        in one transaction with other writes, put ``transaction.atomic()``, the writes
        and ``enqueue()`` in one sync function and await that through ``sync_to_async``.
        """
        enqueue = sync_to_async(cls.enqueue, thread_sensitive=True)
        return await enqueue(process_after=process_after, **fields)

    @classmethod
    async def aenqueue_many(
        cls,
        items: Iterable[dict[str, Any]],
        *,
        process_after: datetime | timedelta | None = None,
    ) -> list[UniqueJob]:
        """:meth:`enqueue_many` from async code, as :meth:`aenqueue` runs ``enqueue()``."""
        enqueue_many = sync_to_async(cls.enqueue_many, thread_sensitive=True)
        return await enqueue_many(items, process_after=process_after)

    @classmethod
    def dispatch(cls) -> int:
        """Hand the next ready jobs to django-q2 now; return how many (what the schedule does)."""
        from django_outbox.unique.dispatch import dispatch

        return dispatch(cls).dispatched

    @classmethod
    def prunable(cls) -> QuerySet:
        """Processed and failed jobs that finished longer than ``retention_days`` ago."""
        days = kind_options(cls).retention_days
        return cls._default_manager.filter(
            state__in=_FINISHED, finished_at__lt=Now() - timedelta(days=days)
        )


def _index_name(table: str, role: str, fields: Sequence[str]) -> str:
    """A name of at most 30 characters, unique per table, role and fields.

    Index and constraint names are global in a database, and Django limits them to 30
    characters: ``%(class)s`` placeholders do not fit, a digest does.
    """
    digest = names_digest(table, role, *fields, length=8)
    return f"{table[:12].rstrip('_')}_{role}_{digest}"


def unstarted_with_key(model: type[UniqueJob]) -> Q:
    """The unique index's condition: jobs not started (:data:`UNSTARTED`) whose key
    holds no NULL (a keyless job never conflicts, so it costs the index nothing)."""
    return with_keys(UNSTARTED, keyless_fields(model))


def with_keys(condition: Q, nullable: Sequence[str]) -> Q:
    """*condition*, and none of the *nullable* key fields NULL."""
    for name in nullable:
        condition &= Q(**{f"{name}__isnull": False})
    return condition


@receiver(class_prepared)
def _add_kind_indexes(sender: type[models.Model], **kwargs: Any) -> None:
    """Give each concrete kind the partial indexes its options call for.

    * unique fields among jobs not started, :data:`UNSTARTED` (unique until a worker
      starts the job; ``enqueue``'s conflict target);
    * exclusive fields among running jobs (unique while executing);
    (a job whose key holds a NULL, ``nullable_keys``, has no key: it is in neither);
    * the dispatch order among pending jobs: ``id`` (``created``) or
      ``process_after, id`` (``ready``), and the exclusive key when several jobs of a
      key can be pending;
    * running jobs by lease expiry (the concurrency count and the rescue);
    * finished jobs by finish time (pruning).

    They are added to ``Meta.indexes``/``constraints`` and to the options Django's
    migration state reads, so ``makemigrations`` writes them even when the kind
    declares a ``Meta`` of its own.
    """
    if not issubclass(sender, UniqueJob) or sender._meta.abstract or sender._meta.proxy:
        return
    options = kind_options(sender)
    columns = {field.name for field in sender._meta.local_fields}
    if not set(options.unique_fields) | set(options.exclusive_fields) <= columns:
        return  # an unknown field: check E072 reports it, makemigrations must not crash
    table = sender._meta.db_table
    pending = Q(state=JobState.PENDING)
    running = Q(state=JobState.RUNNING)
    constraints: list[models.BaseConstraint] = []
    if options.unique_fields:
        constraints.append(
            models.UniqueConstraint(
                fields=list(options.unique_fields),
                condition=unstarted_with_key(sender),
                name=_index_name(table, "pend", options.unique_fields),
            )
        )
    if options.exclusive_fields:
        keyed = keyless_fields(sender, options.exclusive_fields)
        constraints.append(
            models.UniqueConstraint(
                fields=list(options.exclusive_fields),
                condition=with_keys(running, keyed),
                name=_index_name(table, "run", options.exclusive_fields),
            )
        )
    order = ["id"] if options.ordering != "ready" else ["process_after", "id"]
    if options.priority_field in columns:
        order = [f"-{options.priority_field}", *order]
    indexes = [
        models.Index(fields=order, condition=pending, name=_index_name(table, "next", order))
    ]
    if options.exclusive_fields and not options.one_pending_per_exclusive_key:
        key = [*options.exclusive_fields, "id"]
        indexes.append(
            models.Index(fields=key, condition=pending, name=_index_name(table, "key", key))
        )
    indexes.append(
        models.Index(
            fields=["lease_expires_at"],
            condition=running,
            name=_index_name(table, "lease", ["lease_expires_at"]),
        )
    )
    indexes.append(
        models.Index(
            fields=["finished_at"],
            condition=Q(state__in=_FINISHED),
            name=_index_name(table, "done", ["finished_at"]),
        )
    )
    ours = {c.name for c in constraints} | {i.name for i in indexes}
    meta = sender._meta
    meta.constraints = [c for c in meta.constraints if c.name not in ours] + constraints
    meta.indexes = [i for i in meta.indexes if i.name not in ours] + indexes
    meta.original_attrs["constraints"] = meta.constraints
    meta.original_attrs["indexes"] = meta.indexes


def all_kinds() -> list[type[UniqueJob]]:
    """Every concrete unique-job kind of the installed apps."""

    return [
        model
        for model in apps.get_models()
        if issubclass(model, UniqueJob) and not model._meta.proxy
    ]


def get_kind(label: str) -> type[UniqueJob]:
    """Return the kind named ``app_label.ModelName``; raise LookupError for any other."""

    model = apps.get_model(label)
    if not issubclass(model, UniqueJob):
        raise LookupError(f"{label} is not a unique-job kind (a subclass of UniqueJob).")
    return model

"""Per-stream runtime state that operators change without a deploy."""

from __future__ import annotations

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models.functions import Now

from django_outbox.base.routing import StreamScopedManager
from django_outbox.conf import MAX_BATCH_SIZE


class StreamState(models.Model):
    """Runtime switches of one stream, and whether its run loop is wanted again.

    ``paused`` and ``batch_size_override`` are obeyed by the next claim. ``wanted`` is
    raised by a commit that wrote rows while a run of the stream was in flight, and
    lowered by the run that claims again because of it (see :mod:`django_outbox.streams.run`).
    ``claim_floor`` is where claims of the stream start in the buffer's id order on a
    database that keeps dead index entries (PostgreSQL; see
    :mod:`django_outbox.streams.claim_floor`): every row at or below it is claimed, or recorded
    as a :class:`FloorHole`. ``floor_pending`` is the id the floor may move to next, and
    ``floor_barrier`` the transactions it waits for first.
    ``wake_epoch`` is raised by a run that is about to end, so that it can wait for the
    publishers that skipped their wake while it was in flight
    (:mod:`django_outbox.streams.sql.wake_guard`).
    ``next_call_at``, ``paused_until``, ``budget_calls`` and ``budget_rows`` are the
    stream's rate budget and pause (see :mod:`django_outbox.streams.budget`).
    """

    stream = models.CharField(max_length=64, primary_key=True)
    paused = models.BooleanField(default=False)
    batch_size_override = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(MAX_BATCH_SIZE)],
        help_text=f"Overrides the stream's BATCH_SIZE when set (1 to {MAX_BATCH_SIZE:,}).",
    )
    wanted = models.BooleanField(
        default=False,
        editable=False,
        help_text="Rows were committed while a run was in flight: the run claims again.",
    )
    claim_floor = models.BigIntegerField(
        default=0,
        editable=False,
        help_text="Every buffer row of the stream with an id up to this one is claimed: "
        "claims start above it.",
    )
    floor_pending = models.BigIntegerField(
        default=0,
        editable=False,
        help_text="The id the claim floor may move to next; a buffer insert at or below "
        "it takes the floor's lock (see django_outbox.streams.claim_floor).",
    )
    floor_barrier = models.JSONField(
        null=True,
        blank=True,
        editable=False,
        help_text="The transactions the claim floor's next move waits for (64-bit ids).",
    )
    wake_epoch = models.BigIntegerField(
        default=0,
        editable=False,
        help_text="Raised by a run about to end; publishers that skipped their wake "
        "under the previous value are waited for (see django_outbox.streams.sql.wake_guard).",
    )
    next_call_at = models.DateTimeField(
        null=True,
        blank=True,
        editable=False,
        help_text="The rate budget: no handler call of the stream starts before this time "
        "(its CALLS_PER_SECOND, or a pause a handler asked for).",
    )
    paused_until = models.DateTimeField(
        null=True,
        blank=True,
        editable=False,
        help_text="A handler raised RetryAfter: no handler call of the stream starts "
        "before this time.",
    )
    budget_calls = models.BigIntegerField(
        default=0,
        editable=False,
        help_text="Handler calls made under the stream's CALLS_PER_SECOND, since the start.",
    )
    budget_rows = models.BigIntegerField(
        default=0,
        editable=False,
        help_text="Rows handed to the handler under the stream's ROWS_PER_SECOND, since the start.",
    )
    updated_at = models.DateTimeField(db_default=Now(), editable=False)

    objects = StreamScopedManager()  # on its stream's database

    class Meta:
        verbose_name = "stream state"
        permissions = [
            ("operate_streamstate", "Can pause and resume streams and override batch sizes")
        ]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(batch_size_override__isnull=True)
                | models.Q(batch_size_override__gte=1, batch_size_override__lte=MAX_BATCH_SIZE),
                name="outbox_state_batch_size_bound",
            )
        ]

    def __str__(self) -> str:
        return f"{self.stream} ({'paused' if self.paused else 'running'})"


class FloorHole(models.Model):
    """Buffer rows of a stream written at or below its claim floor: *low* to *high*.

    Written by the buffer's insert trigger (PostgreSQL, :mod:`django_outbox.streams.claim_floor`)
    in the writer's transaction, so it commits with the rows. A claim starts below the
    lowest hole of its stream; the floor's next move deletes the holes whose rows are all
    claimed.
    """

    id = models.BigAutoField(primary_key=True)
    stream = models.CharField(max_length=64)
    low = models.BigIntegerField()
    high = models.BigIntegerField()

    objects = StreamScopedManager()  # on its stream's database

    class Meta:
        verbose_name = "claim floor hole"
        indexes = [models.Index(fields=["stream", "low"], name="outbox_floorhole_low")]

    def __str__(self) -> str:
        return f"{self.stream} {self.low}..{self.high}"


class KindState(models.Model):
    """Runtime state of one unique-job kind (``app_label.ModelName``).

    ``wake_epoch`` is raised by a worker whose chunks of the kind end, so that it can
    wait for the enqueues that skipped their dispatch while the kind was at its
    concurrency (:mod:`django_outbox.streams.sql.wake_guard`). The row is written by the first
    such worker.
    """

    kind = models.CharField(max_length=200, primary_key=True)
    wake_epoch = models.BigIntegerField(default=0, editable=False)

    class Meta:
        verbose_name = "job kind state"

    def __str__(self) -> str:
        return self.kind

"""Jobs staged inside the application's transaction, waiting to be handed to django-q2."""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now

from django_outbox.base.routing import StreamScopedManager


class StagedJob(models.Model):
    """One django-q2 job written by ``stage_task()``; the drainer forwards and deletes it.

    A row exists only if the transaction that staged it committed, so a rolled-back job
    never runs; it is deleted in the same transaction that hands it to django-q2, so a
    committed job is never lost.
    """

    id = models.BigAutoField(primary_key=True)
    func = models.CharField(max_length=255, help_text="Dotted path of the task function.")
    args = models.JSONField(default=list, blank=True)
    kwargs = models.JSONField(default=dict, blank=True)
    q_options = models.JSONField(
        default=dict, blank=True, help_text="django-q2 options: cluster, timeout, group…"
    )
    idempotency_key = models.CharField(
        max_length=255,
        blank=True,
        default="",
        help_text="When set, the job's effect happens once per key, however often it runs.",
    )
    created_at = models.DateTimeField(db_default=Now())
    #: The W3C ``traceparent`` of the span that staged the job (OpenTelemetry), if any.
    trace_context = models.CharField(  # noqa: DJ001 (NULL: no trace, as on buffer rows)
        max_length=55, null=True, blank=True, editable=False
    )
    run_after = models.DateTimeField(
        null=True, blank=True, help_text="Not forwarded before this time (database clock)."
    )
    forwarded_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="Handed to a broker that can lose jobs (Redis): the job deletes this row "
        "once it has run; until then the drainer hands it over again every "
        "STAGING['REDELIVER_SECONDS'].",
    )
    forward_count = models.PositiveIntegerField(
        db_default=0,
        help_text="How often the drainer handed it to a broker that can lose jobs (Redis); "
        "after STAGING['MAX_FORWARDS'] it is kept with an error instead.",
    )
    last_error = models.TextField(
        blank=True,
        default="",
        help_text="Why the drainer could not forward this job; it stays here until fixed.",
    )

    #: On the database of the work in hand (a stream's run, ``stage_task(using=...)``,
    #: the drain of one database): a staged job commits with the write it belongs to.
    objects = StreamScopedManager()

    class Meta:
        verbose_name = "staged job"
        permissions = [("forward_stagedjob", "Can forward staged jobs now")]

    def __str__(self) -> str:
        return f"#{self.pk} {self.func}"

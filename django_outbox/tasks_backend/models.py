"""The task table: one row per enqueued ``django.tasks`` task, a unique-job kind.

A row goes through the job engine's states (pending, running, processed, failed), which
the backend reports as Django's READY, RUNNING, SUCCESSFUL and FAILED.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.core.signals import setting_changed
from django.db import models
from django.dispatch import receiver

from django_outbox.models.unique import UniqueJob
from django_outbox.tasks_backend.options import configured


class TaskRecord(UniqueJob):
    """An enqueued task: what to call, with what, and what came of it."""

    task_path = models.CharField(
        max_length=255, help_text="The task's module path (module.function)."
    )
    backend = models.CharField(max_length=100, default="default", help_text="The TASKS alias.")
    queue_name = models.CharField(max_length=100, default="default")
    priority = models.SmallIntegerField(default=0, help_text="Higher values start first.")
    takes_context = models.BooleanField(default=False)
    args = models.JSONField(default=list, blank=True)
    kwargs = models.JSONField(default=dict, blank=True)
    # NULL, not "": a task without a key never conflicts (NULLs are distinct in the
    # unique index over pending tasks).
    unique_key = models.CharField(  # noqa: DJ001
        max_length=255,
        null=True,
        blank=True,
        help_text="At most one task of this task path per key not started yet, and one running.",
    )
    idempotency_key = models.CharField(
        max_length=255,
        blank=True,
        default="",
        help_text="The task's effect is committed once per key (an idempotency key).",
    )
    return_value = models.JSONField(null=True, blank=True)
    worker_ids = models.TextField(
        blank=True, default="", help_text="The worker of each attempt, one per line."
    )

    class Job:
        unique_fields = ["task_path", "unique_key"]
        nullable_keys = True
        priority_field = "priority"
        result_field = "return_value"
        workers_field = "worker_ids"
        max_attempts = 3
        concurrency = 500
        chunk_size = 50

    class Meta:
        verbose_name = "task"
        verbose_name_plural = "tasks"

    def __str__(self) -> str:
        return f"{self.task_path} #{self.pk} ({self.state}, attempt {self.attempt})"

    @classmethod
    def configured_job_options(cls) -> dict[str, Any]:
        """The options the OPTIONS of ``TASKS`` set (see :mod:`.options`)."""
        return configured()

    def trace_span(self) -> tuple[str, dict[str, Any]]:
        """A task runs in the span ``django.tasks <module.function>``, a child of the
        span that enqueued it."""
        return f"django.tasks {self.task_path}", {
            "django_outbox.task": self.task_path,
            "django_outbox.task_id": str(self.pk),
            "django_outbox.attempt": self.attempt,
        }

    def perform(self, heartbeat: Callable[[], None]) -> Any:
        """Call the task with its arguments; return its (JSON) return value."""
        from django_outbox.tasks_backend.execute import perform

        return perform(self, heartbeat)


@receiver(setting_changed)
def _forget_options(*, setting: str, **kwargs: Any) -> None:
    """The kind's options are cached on the class: a test that changes ``TASKS`` (or the
    cluster the kind's default comes from) gets them read again."""
    if setting in ("TASKS", "Q_CLUSTER") and "_kind_options" in TaskRecord.__dict__:
        del TaskRecord._kind_options

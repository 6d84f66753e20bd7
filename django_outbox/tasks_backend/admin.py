"""The admin of task records: a unique-job kind's admin with the task's own columns."""

from __future__ import annotations

from typing import Any

from django.contrib import admin

from django_outbox.admin import StageFilter, UniqueJobAdmin
from django_outbox.models.unique import stage_of
from django_outbox.tasks_backend.models import TaskRecord


@admin.register(TaskRecord)
class TaskRecordAdmin(UniqueJobAdmin):
    list_display = (
        "id",
        "task_path",
        "queue_name",
        "priority",
        "status",
        "attempt",
        "process_after",
        "finished_at",
        "short_error",
    )
    # No filter over queue_name or task_path: listing their values scans the table.
    list_filter = (StageFilter,)
    text_search_fields = ("task_path", "=unique_key", "=idempotency_key", "last_error")

    @admin.display(description="status", ordering="state")
    def status(self, record: Any) -> str:
        from django_outbox.tasks_backend.backend import STATUS

        return str(STATUS[stage_of(record)].label)

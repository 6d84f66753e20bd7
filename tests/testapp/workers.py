"""Bodies of child processes started by the process-tier tests."""

from __future__ import annotations

import sys


def process_once(stream: str, group_id: str) -> None:
    """Process one group, as a django-q2 worker would, and print the outcome."""
    import django

    django.setup()
    from django_outbox.streams.attempt import process_group

    outcome = process_group(stream, group_id)
    print(outcome.value, flush=True)
    sys.exit(0)


def stage_jobs(prefix: str, count: int) -> None:
    """Stage *count* jobs, one transaction each, as application code would."""
    import django

    django.setup()
    from django.db import transaction

    from django_outbox.jobs.staging import stage_task

    for n in range(count):
        with transaction.atomic():
            stage_task("tests.testapp.jobs.record", f"{prefix}-{n}")
    sys.exit(0)

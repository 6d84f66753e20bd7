"""Bodies of child processes started by the unique-job process tests."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from datetime import timedelta


def enqueue_burst(start_file: str, threads: int, per_thread: int) -> None:
    """Enqueue the same key from *threads* connections at once, *per_thread* times each.

    Each thread connects, then waits for *start_file*; each enqueue is its own
    transaction. Prints a JSON list of ``[job id, created]``.
    """
    import django

    django.setup()
    from django.db import connection, transaction

    from tests.uniqueapp.models import KeyedJob

    results: list[list[object]] = []
    lock = threading.Lock()

    def burst(n: int) -> None:
        connection.ensure_connection()
        while not os.path.exists(start_file):
            time.sleep(0.001)
        try:
            for i in range(per_thread):
                with transaction.atomic():
                    job, created = KeyedJob.enqueue(
                        key="burst", note=f"{os.getpid()}-{n}-{i}", process_after=timedelta(hours=1)
                    )
                with lock:
                    results.append([job.pk, created])
        finally:
            connection.close()

    workers = [threading.Thread(target=burst, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    print("ready", flush=True)
    for worker in workers:
        worker.join()
    print(json.dumps(results), flush=True)
    sys.exit(0)


def execute_once(kind: str, job_id: int, attempt: int) -> None:
    """Run one attempt of a job, as a django-q2 worker would, and print the outcome."""
    import django

    django.setup()
    from django_outbox.transport import handoff
    from django_outbox.unique.execute import execute_job

    with handoff.capture():  # the dispatch after the job stays in this process
        outcome = execute_job(kind, job_id, attempt)
    print(outcome.value, flush=True)
    sys.exit(0)


def enqueue_and_recycle(key: str) -> None:
    """A django-q2 task: enqueue a job of *key*, in a worker that recycles after it.

    The dispatch after the commit goes to the dispatcher thread
    (``DISPATCH_ON_COMMIT = "thread"``), told here to gather kicks for an hour: only the
    worker's exit, right after this task, can hand it over.
    """
    from django.db import transaction

    from django_outbox.unique import background
    from tests.uniqueapp.models import KeyedJob

    background.GATHER_SECONDS = 3600
    with transaction.atomic():
        KeyedJob.enqueue(key=key)

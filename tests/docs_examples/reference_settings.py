"""The settings reference's examples: every option set, in a configuration that passes.

``docs/reference/settings.md`` includes the sections; the reference hook
(``docs/hooks/reference.py``) stops the build when an option of the code is missing from
them, and ``tests/docs/test_docs_reference.py`` runs the system checks on them and runs
the stream through its hooks (``shipments.py``). The kind is declared where the test runs
this file, in isolated apps of this package (its ``Meta``, left out of the page), never in
the suite's apps.
"""

from __future__ import annotations

# --8<-- [start:settings-imports]
import os

# --8<-- [end:settings-imports]
# --8<-- [start:kind-imports]
from collections.abc import Callable

from django.db import models

from django_outbox.models import UniqueJob

# --8<-- [end:kind-imports]

# --8<-- [start:settings]
DJANGO_OUTBOX = {
    "STREAMS": {
        "shipments": {
            "HANDLER": "tests.docs_examples.shipments.ship",  # ship(batch), below
            "MODEL": "testapp.OrderedEvent",  # a BufferEvent subclass of your own
            "BATCH_SIZE": 200,  # rows per handler call
            "RUNS": 2,  # runs of the stream in flight at most
            "EVERY_MINUTES": 5,  # the distribute schedule (every commit wakes it too)
            "MAX_ATTEMPTS": 5,  # then the rows become dead letters
            "BACKOFF_SECONDS": 30,  # retries after about 30 s, 60 s, 120 s…
            "BACKOFF_MAX_SECONDS": 900,  # … and at most 15 minutes apart
            "LEASE_SECONDS": 600,  # longer than any handler call (no AUTO_HEARTBEAT)
            "HANDOFF_SECONDS": 60,  # Redis broker: a lost run job is replaced after 60 s
            "ARCHIVE": False,  # delete delivered rows (dead letters are archived anyway)
            "TRANSACTIONAL": True,  # the handler's writes commit with its group's end
            "CLUSTER": "bulk",  # Q_CLUSTER["ALT_CLUSTERS"]["bulk"] runs its jobs
            "DATABASE": "default",  # its rows, groups, state and archive live there
            "ON_EXHAUSTED": "tests.docs_examples.shipments.cancel",  # cancel(batch, error)
            "ISOLATE_FAILURES": False,  # the handler always sees a group's rows together
            "AUTO_HEARTBEAT": False,  # no heartbeat thread: LEASE_SECONDS covers a call
            "ORDER_KEY": "aggregate_id",  # the rows of one order arrive in id order
            "ORDER_AFTER_DEAD_LETTER": "continue",  # a dead letter holds nothing back
            "CALLS_PER_SECOND": 5,  # the warehouse's rate limit, across every worker
            "ROWS_PER_SECOND": 500,  # and its rows a second
            "ARCHIVE_RETENTION_DAYS": 3,  # its archived done rows (none with ARCHIVE off)
            "ARCHIVE_FAILED_RETENTION_DAYS": 365,  # its dead letters, kept for a year
        },
    },
    "ARCHIVE_RETENTION_DAYS": 14,  # archived done rows of every other stream
    "ARCHIVE_FAILED_RETENTION_DAYS": 180,  # and their dead letters
    "STAGING": {
        "ALLOWED_MODULES": ["tests.docs_examples.jobs"],  # whose functions may be staged
        "BATCH_SIZE": 200,  # staged jobs per drain transaction
        "EVERY_MINUTES": 2,  # the drain schedule
        "DRAIN_SECONDS": 240,  # below the timeout of the bulk cluster (540)
        "FORWARD_ON_COMMIT": False,  # leave every job to the drainer
        "REDELIVER_SECONDS": 900,  # Redis broker: above every cluster's timeout
        "MAX_FORWARDS": 3,  # then the job is kept with an error, for an operator
        "CLUSTER": "bulk",  # the cluster that runs the drain schedule
    },
    "IDEMPOTENCY": {"RETENTION_DAYS": 30},  # completed keys are kept 30 days
    "PRUNE_EVERY_MINUTES": 60,  # the prune schedule
    "METRICS_TOKEN": os.environ["OUTBOX_METRICS_TOKEN"],  # 16 characters or more
    "DISPATCH_ON_COMMIT": "thread",  # a worker dispatches the jobs a commit enqueued
}
Q_CLUSTER = {
    "name": "shop",
    "orm": "default",
    "timeout": 300,
    "retry": 360,
    "ALT_CLUSTERS": {"bulk": {"timeout": 540, "retry": 660}},
}
# --8<-- [end:settings]


def ledger_total(account: int | None, period: str) -> int:
    """Stand-in for your own query: the sum of an account's entries in a period."""
    return 0


# --8<-- [start:kind]
class RecomputeTotals(UniqueJob):
    """Recompute an account's totals for one month."""

    account = models.IntegerField(null=True)  # None: the bank's own books
    period = models.CharField(max_length=7)  # "2026-11"
    priority = models.IntegerField(default=0)
    totals = models.JSONField(null=True)  # what perform() returned
    workers = models.TextField(default="")  # host:pid of every attempt

    class Job:
        unique_fields = ["account", "period"]  # one pending job per account and month
        unique_while_executing = ["account"]  # one running job per account
        ordering = "ready"  # of an account's jobs, the first due starts first
        max_attempts = 3  # then the job is failed
        backoff_seconds = 2.5  # retries after about 2.5 s, 5 s…
        backoff_max_seconds = 300  # … at most 5 minutes apart
        concurrency = 20  # jobs running or queued at once
        chunk_size = 10  # jobs per django-q2 task
        jobs_per_statement = 4  # jobs started by one statement
        priority_field = "priority"  # higher first
        result_field = "totals"
        workers_field = "workers"
        nullable_keys = True  # account may be None: such a job has no key
        lease_seconds = 120  # covers the queue wait and the time between heartbeats
        cluster = "bulk"  # Q_CLUSTER["ALT_CLUSTERS"]["bulk"] runs its jobs
        retention_days = 30  # then processed and failed jobs are pruned
        dispatch_every_minutes = 5  # the dispatch schedule (enqueue kicks it too)

    def perform(self, heartbeat: Callable[[], None]) -> dict:
        total = ledger_total(self.account, self.period)  # your own query
        heartbeat()  # still ours
        return {"period": self.period, "total": total}

    # --8<-- [end:kind]
    class Meta:  # the test declares the kind in isolated apps of this package
        app_label = "docs_examples"


# --8<-- [start:tasks]
TASKS = {
    "default": {
        "BACKEND": "django_outbox.tasks_backend.OutboxTaskBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {
            "MAX_ATTEMPTS": 3,  # then the task is FAILED
            "BACKOFF_SECONDS": 5,  # retries after about 5 s, 10 s…
            "BACKOFF_MAX_SECONDS": 600,  # … at most 10 minutes apart
            "CONCURRENCY": 50,  # tasks running or queued at once
            "CHUNK_SIZE": 25,  # tasks per django-q2 task
            "JOBS_PER_STATEMENT": 16,  # tasks started by one statement
            "LEASE_SECONDS": 120,  # covers the queue wait of a task
            "CLUSTER": "bulk",  # Q_CLUSTER["ALT_CLUSTERS"]["bulk"] runs them
            "RETENTION_DAYS": 3,  # then finished tasks are pruned
            "DISPATCH_EVERY_MINUTES": 5,  # the dispatch schedule (enqueue kicks it too)
        },
    }
}
# --8<-- [end:tasks]

"""Settings of the benchmark (PostgreSQL only): ``BENCH_DATABASE_URL`` names the database."""

from __future__ import annotations

import importlib.util
import os
import sys

import dj_database_url
import django

# ``python -m benchmarks.run --otel`` compares B with opentelemetry-api importable (no
# SDK configured) against B in a cluster where it cannot be imported.
if os.environ.get("BENCH_NO_OTEL") == "1":
    sys.modules["opentelemetry"] = None  # type: ignore[assignment]

SECRET_KEY = "django-outbox-benchmark"
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["django.contrib.contenttypes", "django_q", "django_outbox", "benchmarks"]
# The django.tasks benchmark (benchmarks.djtasks, Django 6.0+): our backend as "default",
# django-tasks-db's as "db" when it is installed.
if django.VERSION >= (6, 0):
    INSTALLED_APPS.append("django_outbox.tasks_backend")
    TASKS = {
        "default": {
            "BACKEND": "django_outbox.tasks_backend.OutboxTaskBackend",
            "OPTIONS": {
                "CONCURRENCY": int(os.environ.get("BENCH_TASK_CONCURRENCY", "500")),
                # The default unless a run sets it (JOBS_PER_STATEMENT's default is 8).
                **(
                    {"JOBS_PER_STATEMENT": int(os.environ["BENCH_JOBS_PER_STATEMENT"])}
                    if os.environ.get("BENCH_JOBS_PER_STATEMENT")
                    else {}
                ),
            },
        }
    }
    if importlib.util.find_spec("django_tasks_db"):
        INSTALLED_APPS.append("django_tasks_db")
        TASKS["db"] = {"BACKEND": "django_tasks_db.DatabaseBackend"}
# Persistent connections, as in production: django-q2 closes stale ones around each task.
DATABASES = {
    "default": dj_database_url.parse(
        os.environ["BENCH_DATABASE_URL"], conn_max_age=600, conn_health_checks=True
    )
}
# BENCH_PREPARED=1: prepared statements for every contender alike (psycopg 3: server-side
# binding, each statement prepared on its fifth use on a connection; Django's default
# prepares nothing).
PREPARED_STATEMENTS = os.environ.get("BENCH_PREPARED") == "1"
if PREPARED_STATEMENTS:
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        server_side_binding=True, prepare_threshold=5
    )

Q_CLUSTER = {
    "name": "bench",
    "orm": "default",
    "workers": 2,
    "timeout": 120,
    "retry": 180,
    "poll": 0.05,
    "catch_up": False,
    # The schedules are the safety net only; the latency runs keep them off to show the
    # commits alone move the rows (BENCH_SCHEDULER=1 turns them on, as in production).
    "scheduler": os.environ.get("BENCH_SCHEDULER") == "1",
}
# The children that measure the Redis broker (benchmarks.clusters, the publish and
# first-call children of benchmarks.run) set BENCH_BROKER=redis. BENCH_REDIS_URL alone
# only names the Redis they use (else they start a throwaway one): the main run, whose
# other steps need the ORM broker, stays on it.
if os.environ.get("BENCH_BROKER") == "redis":
    del Q_CLUSTER["orm"]
    Q_CLUSTER["redis"] = os.environ["BENCH_REDIS_URL"]

DJANGO_OUTBOX = {
    "STREAMS": {
        "bench": {
            "HANDLER": "benchmarks.tasks.serialize_batch",
            "BATCH_SIZE": 1000,
            "LEASE_SECONDS": 300,
        },
        # From a commit to the handler's first call (benchmarks.first_call): B's stream,
        # with a handler that stamps the database's clock as it starts.
        "first_call": {
            "HANDLER": "benchmarks.tasks.stamp_batch",
            "BATCH_SIZE": 1000,
            "LEASE_SECONDS": 300,
        },
        # The publish overhead (benchmarks.run.publish_overhead): the same stream idle,
        # with a run in flight, and woken after commit, each a stream of its own.
        **{
            name: {"HANDLER": "benchmarks.tasks.serialize_batch"}
            for name in ("publish_idle", "publish_busy", "publish_woken")
        },
        # Failure isolation: one poison row in a group (benchmarks.isolation).
        "poison": {"HANDLER": "benchmarks.isolation.refuse_poison"},
        # Every option at its default: the custom-buffer path a new user starts with.
        "orders": {
            "HANDLER": "benchmarks.tasks.serialize_orders",
            "MODEL": "benchmarks.OrderEvent",
        },
        # Ordered streams (benchmarks.ordered): the same rows, unordered and ordered.
        "keyed": {"HANDLER": "benchmarks.tasks.serialize_keyed", "MODEL": "benchmarks.KeyedEvent"},
        "keyed_ordered": {
            "HANDLER": "benchmarks.tasks.serialize_keyed",
            "MODEL": "benchmarks.OrderedKeyedEvent",
            "ORDER_KEY": "aggregate",
        },
    },
    "STAGING": {"ALLOWED_MODULES": ["benchmarks.tasks"]},
}
# The rate budget (benchmarks.budget): a stream held to CALLS_PER_SECOND by every cluster,
# and the latency stream with a budget it never reaches.
DJANGO_OUTBOX["STREAMS"]["paced"] = {
    "HANDLER": "benchmarks.tasks.serialize_batch",
    "BATCH_SIZE": 10,
    "CALLS_PER_SECOND": float(os.environ.get("BENCH_CALLS_PER_SECOND", "20")),
}
if os.environ.get("BENCH_ROWS_PER_SECOND"):  # the row budget instead (batches of 100)
    DJANGO_OUTBOX["STREAMS"]["paced"] = {
        "HANDLER": "benchmarks.tasks.serialize_batch",
        "BATCH_SIZE": 100,
        "ROWS_PER_SECOND": float(os.environ["BENCH_ROWS_PER_SECOND"]),
    }
if os.environ.get("BENCH_ORDERS_CALLS_PER_SECOND"):
    DJANGO_OUTBOX["STREAMS"]["orders"]["CALLS_PER_SECOND"] = float(
        os.environ["BENCH_ORDERS_CALLS_PER_SECOND"]
    )

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"null": {"class": "logging.NullHandler"}},
    "loggers": {"django-q": {"handlers": ["null"], "propagate": False}},
}

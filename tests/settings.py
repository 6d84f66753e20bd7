"""Settings for the test suite.

``DATABASE_URL`` selects the database: unset or empty means SQLite, a ``postgres://``
URL means PostgreSQL. ``pytest --postgres`` sets it before these settings load
(``tests/postgres_plugin.py``); ``python3 dev.py test`` runs both tiers.
"""

from __future__ import annotations

import copy
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import dj_database_url
import django

# The example project's apps (``marketing``) are part of the test suite; make them
# importable however Django is started (pytest, ``python -m django … --settings``).
_EXAMPLE_PROJECT = str(Path(__file__).resolve().parent.parent / "example_project")
if _EXAMPLE_PROJECT not in sys.path:
    sys.path.append(_EXAMPLE_PROJECT)

SECRET_KEY = "django-outbox-tests"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ALLOWED_HOSTS = ["*"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_q",
    "django_outbox",
    "marketing",
    "payments",
    "blogs",
    "tests.testapp",
    "tests.uniqueapp",
]

# The django.tasks backend exists from Django 6.0 on (django.tasks).
TASKS_AVAILABLE = django.VERSION >= (6, 0)
if TASKS_AVAILABLE:
    # The check test of a project that forgot the app
    # (tests/tasks_backend/test_tasks_backend.py) runs a child without it.
    if os.environ.get("OUTBOX_TEST_NO_TASKS_APP") != "1":
        INSTALLED_APPS.append("django_outbox.tasks_backend")
    TASKS = {
        "default": {
            "BACKEND": "django_outbox.tasks_backend.OutboxTaskBackend",
            "QUEUES": ["default", "emails"],
        }
    }

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "tests.urls"
STATIC_URL = "/static/"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

_url = os.environ.get("DATABASE_URL", "").strip()
if _url:
    DATABASES = {"default": dj_database_url.parse(_url, conn_max_age=0)}
    if os.environ.get("OUTBOX_TEST_PREPARED") == "1":
        # PostgreSQL with prepared statements (psycopg 3), as the README recommends for
        # throughput: server-side binding, each statement prepared on its fifth use.
        DATABASES["default"]["OPTIONS"] = {"server_side_binding": True, "prepare_threshold": 5}
else:
    # A file, not :memory:, so that subprocesses (qcluster, concurrent claimers) share it.
    _name = os.environ.get(
        "OUTBOX_TEST_SQLITE",
        os.path.join(tempfile.gettempdir(), f"django_outbox_tests_{os.getpid()}.sqlite3"),
    )
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": _name,
            "OPTIONS": {
                "transaction_mode": "IMMEDIATE",
                "timeout": 30,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
            "TEST": {"NAME": _name},
        }
    }

# A second database for the tests of streams on many databases
# (tests/streams/test_many_databases.py): pytest-django creates it only for a run that collects
# a test declaring it (``databases={"default", "other"}``). Its name is the default's
# with "2" appended; a child process is given the test copy's name
# (``OUTBOX_TEST_OTHER_NAME``, tests/procs.py). A test that moves it to a server of its
# own gives its children that database's URL (``OUTBOX_TEST_OTHER_URL``,
# tests/processes/test_many_databases_processes.py).
OTHER_DATABASE = "other"
#: The keys that say where a database is (the rest is the default database's).
LOCATION = ("NAME", "HOST", "PORT", "USER", "PASSWORD")
if _url and os.environ.get("OUTBOX_TEST_OTHER_URL"):
    _other = dj_database_url.parse(os.environ["OUTBOX_TEST_OTHER_URL"])
    DATABASES[OTHER_DATABASE] = {
        **copy.deepcopy(DATABASES["default"]),
        "NAME": _other["NAME"],
        "HOST": _other["HOST"],
        "PORT": _other["PORT"],
        "USER": _other["USER"],
        "PASSWORD": _other["PASSWORD"],
    }
elif _url:
    DATABASES[OTHER_DATABASE] = {
        **copy.deepcopy(DATABASES["default"]),
        "NAME": os.environ.get("OUTBOX_TEST_OTHER_NAME") or DATABASES["default"]["NAME"] + "2",
    }
else:
    _other_name = os.environ.get("OUTBOX_TEST_OTHER_NAME") or (
        _name.removesuffix(".sqlite3") + "2.sqlite3"
    )
    DATABASES[OTHER_DATABASE] = {
        **copy.deepcopy(DATABASES["default"]),
        "NAME": _other_name,
        "TEST": {"NAME": _other_name},
    }

Q_CLUSTER: dict[str, Any] = {
    "name": "outbox-tests",
    "orm": "default",
    "workers": 2,
    "timeout": 60,
    "retry": 90,
    "poll": 0.05,
    "catch_up": False,
    "save_limit": 0,
    "max_attempts": 1,
}

# The Redis-broker tests run their children (drainer, qcluster) on Redis: the URL and a
# cluster name of the test's own (its Redis list) come through the environment.
if os.environ.get("OUTBOX_TEST_REDIS_URL"):
    del Q_CLUSTER["orm"]
    Q_CLUSTER["redis"] = os.environ["OUTBOX_TEST_REDIS_URL"]
    Q_CLUSTER["cluster_name"] = os.environ.get("OUTBOX_TEST_Q_NAME", Q_CLUSTER["name"])

DJANGO_OUTBOX: dict[str, Any] = {
    "STREAMS": {
        "marketing": {
            "HANDLER": "marketing.outbox.sync_activities",
            "MODEL": "marketing.ContactActivityEvent",
            "BATCH_SIZE": 100,
            "LEASE_SECONDS": 120,
        },
        "audit": {
            "HANDLER": "tests.testapp.handlers.record",
            "BATCH_SIZE": 10,
            "MAX_ATTEMPTS": 3,
            "BACKOFF_SECONDS": 1,
            "LEASE_SECONDS": 120,
            "ISOLATE_FAILURES": False,  # its tests follow one group's retries
        },
    },
    "STAGING": {"ALLOWED_MODULES": ["tests.testapp.jobs"], "DRAIN_SECONDS": 20},
}
# The ordered stream (tests/test_ordering*.py): rows of one aggregate stay in order.
ORDERED_STREAM: dict[str, Any] = {
    "HANDLER": "tests.testapp.handlers.record_ordered",
    "MODEL": "testapp.OrderedEvent",
    "ORDER_KEY": "aggregate_id",
    "BATCH_SIZE": 10,
    "MAX_ATTEMPTS": 3,
    "BACKOFF_SECONDS": 1,
    "LEASE_SECONDS": 120,
}
# The ordered process test (tests/processes/test_ordering_processes.py): random failures, killed
# workers, on the crash test's cluster (short lease and timeout).
ORDERED_CHAOS_STREAM: dict[str, Any] = {
    **ORDERED_STREAM,
    "HANDLER": "tests.testapp.handlers.ordered_chaos",
    "BATCH_SIZE": 500,
    "MAX_ATTEMPTS": 50,
    "BACKOFF_MAX_SECONDS": 2,
    "LEASE_SECONDS": 3,
    "CLUSTER": "crash",
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"null": {"class": "logging.NullHandler"}},
    "loggers": {"django-q": {"handlers": ["null"], "propagate": False}},
}

# The crash tests (tests/processes/test_crash.py) run a stream with a short lease on a cluster of
# its own; their child processes switch it on through the environment.
CRASH_STREAM = {
    "HANDLER": "tests.testapp.handlers.slow_record",
    "BATCH_SIZE": 500,
    "MAX_ATTEMPTS": 50,
    "BACKOFF_SECONDS": 1,
    "BACKOFF_MAX_SECONDS": 2,
    "LEASE_SECONDS": 3,
    "CLUSTER": "crash",
}
CRASH_CLUSTER = {"timeout": 3, "retry": 5}
if os.environ.get("OUTBOX_TEST_CRASH"):
    DJANGO_OUTBOX["STREAMS"]["crash"] = CRASH_STREAM
    DJANGO_OUTBOX["STREAMS"]["ordered"] = ORDERED_CHAOS_STREAM
    Q_CLUSTER["ALT_CLUSTERS"] = {"crash": CRASH_CLUSTER}
# The process test of streams on many databases (tests/processes/test_many_databases_processes.py):
# the crash stream on each of the two databases, one cluster for both.
CRASH_OTHER_STREAM = {**CRASH_STREAM, "DATABASE": OTHER_DATABASE}
if os.environ.get("OUTBOX_TEST_MANY_DATABASES"):
    DJANGO_OUTBOX["STREAMS"]["crash_other"] = CRASH_OTHER_STREAM
STALL_STREAM = {**CRASH_STREAM, "HANDLER": "tests.testapp.handlers.stall"}
if os.environ.get("OUTBOX_TEST_CRASH"):
    DJANGO_OUTBOX["STREAMS"]["stall"] = STALL_STREAM
POISON_STREAM = {
    **CRASH_STREAM,
    "HANDLER": "tests.testapp.handlers.refuse_poison",
    "MAX_ATTEMPTS": 3,
}
if os.environ.get("OUTBOX_TEST_CRASH"):
    DJANGO_OUTBOX["STREAMS"]["poison"] = POISON_STREAM

# The rate-budget tests (tests/streams/test_budget.py) run a stream limited to 10 handler calls a
# second in child processes and clusters of their own; their children switch it on.
PACED_STREAM = {
    "HANDLER": "tests.testapp.handlers.record_call_time",
    "BATCH_SIZE": 1,
    "CALLS_PER_SECOND": 10,
    "LEASE_SECONDS": 120,
}
if os.environ.get("OUTBOX_TEST_PACED"):
    DJANGO_OUTBOX["STREAMS"]["paced"] = PACED_STREAM
# The retry-timing tests (tests/processes/test_retry_timing.py): a stream whose handler
# fails its first three attempts (backoffs of about 1, 2 and 4 s), and one whose handler
# asks for a pause of 3 s once; their children switch them on.
BACKOFF_STREAM = {
    "HANDLER": "tests.testapp.handlers.fail_three_times",
    "BATCH_SIZE": 10,
    "MAX_ATTEMPTS": 5,
    "BACKOFF_SECONDS": 1,
    "LEASE_SECONDS": 120,
    "ISOLATE_FAILURES": False,  # one group's retries are followed
}
PAUSED_STREAM = {
    "HANDLER": "tests.testapp.handlers.pause_once",
    "BATCH_SIZE": 10,
    "LEASE_SECONDS": 120,
}
if os.environ.get("OUTBOX_TEST_RETRY_TIMING"):
    DJANGO_OUTBOX["STREAMS"]["backoff"] = BACKOFF_STREAM
    DJANGO_OUTBOX["STREAMS"]["paused"] = PAUSED_STREAM
# A row budget (ROWS_PER_SECOND) shared by two processes (tests/streams/test_budget.py).
ROWED_STREAM = {
    "HANDLER": "tests.testapp.handlers.record_call_time",
    "ROWS_PER_SECOND": 20,
    "BATCH_SIZE": 5,
    "LEASE_SECONDS": 120,
}
if os.environ.get("OUTBOX_TEST_ROWED"):
    DJANGO_OUTBOX["STREAMS"]["rowed"] = ROWED_STREAM

# The database-restart test (tests/processes/test_db_restart.py) drains two streams through a
# cluster of its own on a throwaway server; its children switch them on.
OUTAGE_STREAMS: dict[str, dict[str, Any]] = {
    # Exactly-once database effects: the handler's HandledCall row commits with the archive.
    "outage_tx": {"HANDLER": "tests.testapp.handlers.record", "TRANSACTIONAL": True},
    # At-least-once: the HandledCall row commits before the finalize.
    "outage_plain": {"HANDLER": "tests.testapp.handlers.record"},
}
if os.environ.get("OUTBOX_TEST_OUTAGE"):
    DJANGO_OUTBOX["STREAMS"].update(OUTAGE_STREAMS)
    for _option, _variable in [
        ("HANDOFF_SECONDS", "OUTBOX_TEST_HANDOFF"),
        ("LEASE_SECONDS", "OUTBOX_TEST_LEASE"),
    ]:
        if os.environ.get(_variable):  # the fault tests: a short hand-off, a short lease
            for _options in OUTAGE_STREAMS.values():
                _options[_option] = int(os.environ[_variable])
if os.environ.get("OUTBOX_TEST_REDELIVER"):  # the cluster test: lost staged jobs, soon
    DJANGO_OUTBOX["STAGING"]["REDELIVER_SECONDS"] = int(os.environ["OUTBOX_TEST_REDELIVER"])

# The dispatcher-thread test (tests/processes/test_dispatch_thread.py) runs a cluster whose workers
# recycle after each task, with the dispatch after a commit handed to the dispatcher
# thread.
if os.environ.get("OUTBOX_TEST_DISPATCH_ON_COMMIT"):
    DJANGO_OUTBOX["DISPATCH_ON_COMMIT"] = os.environ["OUTBOX_TEST_DISPATCH_ON_COMMIT"]
if os.environ.get("OUTBOX_TEST_Q_RECYCLE"):
    Q_CLUSTER["recycle"] = int(os.environ["OUTBOX_TEST_Q_RECYCLE"])

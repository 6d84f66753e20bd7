"""Settings of the example project.

SQLite (with django-q2's ORM broker) by default; set ``DATABASE_URL`` to a
``postgres://`` URL to run the same demo on PostgreSQL.
"""

from __future__ import annotations

import os
from pathlib import Path

import dj_database_url
import django

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = os.environ.get("SECRET_KEY", "example-project-not-secret")
DEBUG = True
ALLOWED_HOSTS = ["*"]
USE_TZ = True
TIME_ZONE = "UTC"

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
]
# Django 6.0+: django.tasks, with tasks stored and run by django_outbox (blogs.tasks).
if django.VERSION >= (6, 0):
    INSTALLED_APPS.append("django_outbox.tasks_backend")
    TASKS = {"default": {"BACKEND": "django_outbox.tasks_backend.OutboxTaskBackend"}}
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "example_project.urls"
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
STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

if os.environ.get("DATABASE_URL"):
    DATABASES = {"default": dj_database_url.config(conn_max_age=0)}
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": BASE_DIR / "db.sqlite3",
            "OPTIONS": {
                # IMMEDIATE: every transaction takes SQLite's write lock when it begins, so
                # claims from several worker processes are serialized and never overlap.
                "transaction_mode": "IMMEDIATE",
                "timeout": 30,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
        }
    }

Q_CLUSTER = {
    "name": "example",
    "orm": "default",
    "workers": 2,
    "timeout": 60,
    "retry": 120,
    "poll": 0.1,
    "save_limit": 100,
    "catch_up": False,
}

DJANGO_OUTBOX = {
    "STREAMS": {
        "marketing": {
            "HANDLER": "marketing.outbox.sync_activities",
            "MODEL": "marketing.ContactActivityEvent",
            "BATCH_SIZE": 250,
            "MAX_ATTEMPTS": 5,
            "BACKOFF_SECONDS": 1,
            "LEASE_SECONDS": 120,
        },
    },
    "STAGING": {"ALLOWED_MODULES": ["marketing.tasks", "payments.tasks"]},
}

# Every 7th request to the fake marketing API fails with a transient error, so the demo
# shows retries at work.
MARKETING_API = {"FAIL_EVERY": int(os.environ.get("MARKETING_API_FAIL_EVERY", "7"))}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {
        "django-q": {"handlers": ["console"], "level": "WARNING", "propagate": False},
        "django_outbox": {"handlers": ["console"], "level": "WARNING", "propagate": False},
    },
}

"""The settings the tutorial adds to a project (``settings.py`` in the tutorial).

``tests/docs/test_docs_examples.py`` checks them with the app's system checks.
"""

from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
]

# --8<-- [start:apps]
# append to mysite/settings.py
INSTALLED_APPS += [
    "django_q",
    "django_outbox",
    "marketing",  # your app, with the buffer model and the handler
]
# --8<-- [end:apps]

# --8<-- [start:database]
# append to mysite/settings.py
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": BASE_DIR / "db.sqlite3",
        "OPTIONS": {
            # Every transaction takes SQLite's write lock when it begins, so workers
            # claim groups one at a time instead of failing with "database is locked".
            "transaction_mode": "IMMEDIATE",
        },
    }
}
# --8<-- [end:database]

# --8<-- [start:cluster]
# append to mysite/settings.py
Q_CLUSTER = {
    "name": "default",
    "orm": "default",  # django-q2's ORM broker: jobs commit with your data
    "workers": 4,
    "timeout": 240,  # below retry; a stream's LEASE_SECONDS defaults to 300
    "retry": 300,
}
# --8<-- [end:cluster]

# --8<-- [start:outbox]
# append to mysite/settings.py
DJANGO_OUTBOX = {
    "STREAMS": {
        "marketing": {
            "HANDLER": "marketing.outbox.sync_activities",
            "MODEL": "marketing.ContactActivityEvent",
            "BATCH_SIZE": 250,  # rows per handler call (default 1000)
        },
    },
}
# --8<-- [end:outbox]

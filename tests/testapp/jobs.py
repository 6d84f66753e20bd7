"""Task functions the staged-job tests stage (``STAGING["ALLOWED_MODULES"]``)."""

from __future__ import annotations

import functools
import os
import threading
import time
from pathlib import Path
from typing import Any

from django.utils.module_loading import import_string  # noqa: F401 (refused if staged)

from tests.testapp.models import JobEffect


def record(label: str, value: Any = None) -> int:
    """Record one effect; return its id."""
    return JobEffect.objects.create(label=label, value=value).pk


def record_kwargs(label: str, **kwargs: Any) -> int:
    return JobEffect.objects.create(label=label, value=kwargs).pk


NOT_CALLABLE = 42


class FirstDeliveryFails(Exception):
    pass


def fail_first(label: str) -> int:
    """Raise on the first delivery of *label* (the cache remembers it), then record."""
    from django.core.cache import cache

    if cache.add(f"fail-first:{label}", True, None):
        raise FirstDeliveryFails(label)
    return record(label)


#: Set once :func:`record_when_released` runs; it records only after the test sets RELEASED.
STARTED = threading.Event()
RELEASED = threading.Event()


def record_when_released(label: str) -> int:
    """A long job: wait (up to a minute) until the test releases it, then record."""
    STARTED.set()
    RELEASED.wait(60)
    return record(label)


def hook(task: Any) -> None:
    """A django-q2 hook in an allowed module."""


def stall_before_enqueue(sender: str, task: dict[str, Any], **kwargs: Any) -> None:
    """A django-q2 ``pre_enqueue`` receiver that parks the process mid-hand-off.

    Connected in a drainer child by ``OUTBOX_TEST_STALL_ENQUEUE`` (a marker file): it
    writes the marker, then waits forever, so the test can kill the drainer after it
    took rows and before its transaction commits.
    """
    marker = Path(os.environ["OUTBOX_TEST_STALL_ENQUEUE"])
    marker.write_text(str(os.getpid()))
    while True:
        time.sleep(60)


partial_record = functools.partial(record, "partial")

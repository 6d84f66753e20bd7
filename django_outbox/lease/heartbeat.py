"""Automatic heartbeat: work that runs long keeps its lease without calling heartbeat.

The one keeper of leases for work in progress: a stream's handler (with
``AUTO_HEARTBEAT``, on by default) and a ``django.tasks`` task record. While the work
runs, this worker process extends its lease every third of the lease from a daemon
thread of its own (one per process, started on first use, ended after a minute with
nothing to do; it opens a database connection of its own for each round of beats). The
lease then outlives long work for as long as the worker is alive; when the worker dies
or is frozen, the heartbeats stop and the lease expires as before, so crashed work is
still rescued once its lease ran out. A heartbeat that finds the lease gone (taken
over) stops; one that fails on a database error is logged and tried again at the next
beat.

A forked child starts with no beats and no thread: the parent's work is not its own
to keep alive, and the parent's lock may have been held by a thread that did not
follow the fork.

``TRANSACTIONAL`` handlers need none: their group's row is locked for the whole
attempt, and rescue skips locked rows.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from django.db import connections

from django_outbox.exceptions import LeaseLost

logger = logging.getLogger(__name__)

#: The thread looks for due beats this often.
TICK_SECONDS = 0.2
#: With no handler running for this long, the thread ends (the next one starts it again).
IDLE_SECONDS = 60.0


@dataclass
class _Beat:
    heartbeat: Callable[[], None]
    what: object
    every: float
    due: float


_lock = threading.Lock()
_beats: dict[int, _Beat] = {}
_tokens = itertools.count()
_thread: threading.Thread | None = None


@contextlib.contextmanager
def beating(heartbeat: Callable[[], None], lease_seconds: float, what: object) -> Iterator[None]:
    """Call *heartbeat* every third of *lease_seconds* while the block runs (the work:
    a handler's call, a task's); *what* names the work in the log.

    *heartbeat* runs on the keeper's thread: it extends the lease on the work's own
    database (the thread is on none) and raises :class:`LeaseLost` when the lease is
    gone, which ends the beats.
    """
    every = lease_seconds / 3
    token = next(_tokens)
    with _lock:
        _beats[token] = _Beat(heartbeat, what, every, time.monotonic() + every)
        _ensure_thread()
    try:
        yield
    finally:
        with _lock:
            _beats.pop(token, None)


def _forget_beats() -> None:
    """In a forked child: no beats, a fresh lock, no thread (see the module's doc)."""
    global _lock, _thread
    _lock = threading.Lock()
    _beats.clear()
    _thread = None


os.register_at_fork(after_in_child=_forget_beats)


def _ensure_thread() -> None:
    global _thread
    if _thread is None or not _thread.is_alive():
        _thread = threading.Thread(target=_run, name="django_outbox-heartbeat", daemon=True)
        _thread.start()


def _run() -> None:
    idle_since = time.monotonic()
    try:
        while True:
            time.sleep(TICK_SECONDS)
            now = time.monotonic()
            with _lock:
                if not _beats and now - idle_since > IDLE_SECONDS:
                    global _thread
                    _thread = None
                    return
                if _beats:
                    idle_since = now
                due = [(token, beat) for token, beat in _beats.items() if beat.due <= now]
            for token, beat in due:
                _beat(token, beat, now)
            if due:
                connections.close_all()  # this thread's: held only while it beats
    finally:
        connections.close_all()


def _beat(token: int, beat: _Beat, now: float) -> None:
    try:
        beat.heartbeat()
    except LeaseLost:
        with _lock:
            _beats.pop(token, None)
        return
    except Exception:
        logger.warning("Automatic heartbeat of %s failed; trying again", beat.what, exc_info=True)
    beat.due = now + beat.every

"""Dispatch after commit handed to the cluster by a thread of the process
(``DISPATCH_ON_COMMIT = "thread"``).

With the default, ``"inline"``, the thread that committed an enqueue runs the kind's
dispatch right after its commit (a transaction of its own: a millisecond or two of the
request that enqueued). With ``"thread"`` it only records the kind and wakes this
module's dispatcher thread, which hands the dispatch to a worker a moment later:

* woken, the thread gathers kicks for ``GATHER_SECONDS`` (10 ms), then sends each kind
  asked for one django-q2 task that dispatches in the worker taking it and runs the
  chunk it keeps there (:func:`~django_outbox.unique.dispatch.wake_after_commit`;
  none while the kind is at its concurrency). The process writes one queue row per
  kind and interval instead of a dispatch transaction per commit; kicks that arrive
  meanwhile are served by one more round, sent after the commits before them;
* a hand-off that fails is logged; the kind's schedule dispatches later, as after any
  lost kick; so does a process killed before its thread handed the kind over;
* when the process ends, the kinds still wanted are handed over by the exiting thread
  (after the round the dispatcher thread may be in): at interpreter exit, and at the
  end of a ``multiprocessing`` child, where ``atexit`` does not run: a django-q2
  worker that recycles, stops with its cluster or ends after a task's timeout. A
  process killed (SIGKILL, or SIGTERM while it hands over) leaves them to the schedule;
* a forked child starts afresh: nothing wanted, fresh locks and events (the parent's
  may have been held by a thread that did not follow), no thread until its first kick;
* the thread starts on first use in each process and keeps its database connections
  while kicks come (one that failed and no longer answers is closed), closing them
  once idle for ``IDLE_SECONDS``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from multiprocessing import util

from django.db import connections

from django_outbox.models.unique import get_kind
from django_outbox.unique.dispatch import wake_after_commit

logger = logging.getLogger(__name__)

#: The dispatcher thread closes its connections after this long without a kick.
IDLE_SECONDS = 0.5
#: Woken, the thread waits this long for more kicks before it hands the kinds over: a
#: burst of commits costs one task per kind and interval, at most this much later.
GATHER_SECONDS = 0.01
#: At exit, the exiting thread waits this long at most for a round of the dispatcher
#: thread to end before it hands over what is left.
EXIT_WAIT_SECONDS = 5.0


class Dispatcher:
    """The process's dispatcher thread and the kinds it is asked to hand over."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Start afresh: nothing wanted, no thread (a new process, a forked child)."""
        self.lock = threading.Lock()  # guards wanted, idle and thread
        self.handing = threading.Lock()  # held while kinds taken from wanted are handed
        self.wanted: dict[str, None] = {}  # labels, in the order first asked
        self.wake = threading.Event()
        self.idle = threading.Event()  # set while nothing is wanted nor running
        self.idle.set()
        self.thread: threading.Thread | None = None

    def kick(self, label: str) -> None:
        """Ask for a dispatch of the kind *label* (``app_label.ModelName``) soon."""
        with self.lock:
            self.wanted[label] = None
            self.idle.clear()
            if self.thread is None:
                self.thread = threading.Thread(
                    target=self._run, name="outbox-dispatch", daemon=True
                )
                self.thread.start()
                # Run by the exiting thread at interpreter exit (atexit) and at the end
                # of a multiprocessing child (where atexit does not run); a child's
                # first kick registers its own.
                util.Finalize(None, self.flush, exitpriority=10)
        self.wake.set()

    def flush(self, timeout: float = EXIT_WAIT_SECONDS) -> None:
        """Hand over what is still wanted, in the calling thread (the exiting one), once
        the round the dispatcher thread may be in has ended."""
        if not self.handing.acquire(timeout=timeout):
            logger.warning(
                "The dispatcher thread is still handing over after %s s; its schedule "
                "will dispatch what it has not handed.",
                timeout,
            )
            return
        try:
            self._wake(self._take())
        finally:
            self.handing.release()

    def _take(self) -> list[str]:
        with self.lock:
            labels = list(self.wanted)
            self.wanted.clear()
            return labels

    def _run(self) -> None:
        while True:
            if not self.wake.wait(IDLE_SECONDS):
                connections.close_all()  # this thread's own
                with self.lock:
                    if not self.wanted:
                        self.idle.set()
                self.wake.wait()
            time.sleep(GATHER_SECONDS)
            self.wake.clear()
            with self.handing:
                self._wake(self._take())

    def _wake(self, labels: list[str]) -> None:
        for label in labels:
            _drop_broken_connections()
            try:
                wake_after_commit(get_kind(label))
            except Exception:
                logger.warning(
                    "Hand-off of %s's dispatch after a commit failed; its schedule will dispatch.",
                    label,
                    exc_info=True,
                )


def _drop_broken_connections() -> None:
    """Close this thread's connections that failed and no longer answer. The others are
    kept from one round to the next, whatever ``CONN_MAX_AGE`` (a request's lifetime)
    says: connecting anew every 10 ms would cost more than the hand-off itself."""
    for connection in connections.all(initialized_only=True):
        if connection.errors_occurred and not connection.is_usable():
            connection.close()


DISPATCHER = Dispatcher()
# A forked child inherits the parent's state but not its thread: a lock held by a thread
# of the parent at the fork would stay held forever, and the parent's kinds are the
# parent's to hand over.
os.register_at_fork(after_in_child=DISPATCHER.reset)

"""Dispatch after commit from a thread of the process (``DISPATCH_ON_COMMIT = "thread"``).

With the default, ``"inline"``, the thread that committed an enqueue runs the kind's
dispatch right after its commit (a transaction of its own: a couple of milliseconds of
the request that enqueued). With ``"thread"`` it only records the kind and wakes this
module's dispatcher thread, which dispatches it a moment later:

* woken, the thread gathers kicks for ``GATHER_SECONDS`` (10 ms), then dispatches each
  kind asked for once; kicks that arrive while it dispatches are served by one more
  round, which sees every commit made before them;
* a dispatch that fails is logged; the kind's schedule dispatches later, as after any
  lost kick; so does a process killed before its thread dispatched;
* at interpreter exit the kinds still wanted are dispatched by the exiting thread;
* the thread starts on first use in each process (after a fork too) and closes its
  database connections once idle for ``IDLE_SECONDS``.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time

from django.db import close_old_connections, connections

from django_outbox.models.unique import get_kind
from django_outbox.unique.dispatch import dispatch_after_commit

logger = logging.getLogger("django_outbox")

#: The dispatcher thread closes its connections after this long without a kick.
IDLE_SECONDS = 0.5
#: Woken, the thread waits this long for more kicks before it dispatches: a burst of
#: commits costs one dispatch per kind and interval, at most this much later.
GATHER_SECONDS = 0.01


class Dispatcher:
    """The process's dispatcher thread and the kinds it is asked to dispatch."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.wanted: dict[str, None] = {}  # labels, in the order first asked
        self.wake = threading.Event()
        self.idle = threading.Event()  # set while nothing is wanted nor running
        self.idle.set()
        self.pid = 0
        atexit.register(self.flush)

    def kick(self, label: str) -> None:
        """Ask for a dispatch of the kind *label* (``app_label.ModelName``) soon."""
        with self.lock:
            self.wanted[label] = None
            self.idle.clear()
            if self.pid != os.getpid():
                self.pid = os.getpid()
                threading.Thread(target=self._run, name="outbox-dispatch", daemon=True).start()
        self.wake.set()

    def flush(self) -> None:
        """Dispatch what is still wanted, in the calling thread (at exit)."""
        if self.pid == os.getpid():
            self._dispatch(self._take())

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
            self._dispatch(self._take())

    def _dispatch(self, labels: list[str]) -> None:
        for label in labels:
            close_old_connections()
            try:
                dispatch_after_commit(get_kind(label))
            except Exception:
                logger.warning(
                    "Dispatch of %s after a commit failed; its schedule will dispatch.",
                    label,
                    exc_info=True,
                )


DISPATCHER = Dispatcher()

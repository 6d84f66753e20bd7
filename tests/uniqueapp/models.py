"""Unique-job kinds used by the tests, and the table their jobs record their runs in."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

from django.db import models
from django.db.models.functions import Now

from django_outbox.models import UniqueJob


class JobRun(models.Model):
    """One attempt of a test job as its perform() saw it, timed by the database clock."""

    kind = models.CharField(max_length=100)
    job_id = models.BigIntegerField()
    key = models.CharField(max_length=64)
    seq = models.IntegerField()
    attempt = models.PositiveIntegerField()
    pid = models.IntegerField()
    started_at = models.DateTimeField(db_default=Now())
    ended_at = models.DateTimeField(null=True)

    def __str__(self) -> str:
        return f"{self.kind} #{self.job_id} attempt {self.attempt}"


class TestJob(UniqueJob):
    """A job whose payload says how it behaves: how long, how it fails, how it beats.

    In a process started with ``OUTBOX_TEST_STALL_DIR``, perform() writes ``started``
    and waits for ``go`` first, so a test can freeze it mid-job. A job whose note is
    ``"crash"`` kills its own worker process (SIGKILL) on its first attempt.
    """

    key = models.CharField(max_length=64)
    seq = models.IntegerField(default=0)
    note = models.CharField(max_length=64, blank=True, default="")
    work_seconds = models.FloatField(default=0)
    beats = models.PositiveIntegerField(default=0)
    fail_attempts = models.PositiveIntegerField(default=0)

    class Meta:
        abstract = True

    def perform(self, heartbeat: Callable[[], None]) -> None:
        run = JobRun.objects.create(
            kind=self._meta.label,
            job_id=self.pk,
            key=self.key,
            seq=self.seq,
            attempt=self.attempt,
            pid=os.getpid(),
        )
        if self.note == "crash" and self.attempt == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            stall_dir = os.environ.get("OUTBOX_TEST_STALL_DIR")
            if stall_dir:
                (Path(stall_dir) / "started").write_text(str(self.attempt))
                while not (Path(stall_dir) / "go").exists():
                    time.sleep(0.01)
            if self.beats:
                for _ in range(self.beats):
                    time.sleep(self.work_seconds / self.beats)
                    heartbeat()
            else:
                time.sleep(self.work_seconds)
            if self.attempt <= self.fail_attempts:
                raise RuntimeError(f"planned failure of attempt {self.attempt}")
        finally:
            JobRun.objects.filter(pk=run.pk).update(ended_at=Now())


class KeyedJob(TestJob):
    """Unique per key until executed and while executing; short lease, quick retries."""

    class Job:
        unique_fields = ["key"]
        concurrency = 4
        lease_seconds = 5
        max_attempts = 3
        backoff_seconds = 1
        backoff_max_seconds = 2


class ThrottledJob(TestJob):
    """At most two running at a time, whatever the number of workers."""

    class Job:
        unique_fields = ["key"]
        concurrency = 2
        lease_seconds = 60


class OrderedJob(TestJob):
    """Many pending per key (one per seq), one running per key, in creation order."""

    class Job:
        unique_fields = ["key", "seq"]
        unique_while_executing = ["key"]
        ordering = "created"
        concurrency = 4
        lease_seconds = 60
        max_attempts = 2
        backoff_seconds = 1


class ReadyJob(TestJob):
    """Like OrderedJob, but the first ready job of a key is served first."""

    class Job:
        unique_fields = ["key", "seq"]
        unique_while_executing = ["key"]
        ordering = "ready"
        concurrency = 4
        lease_seconds = 60
        max_attempts = 2
        backoff_seconds = 1


class BeatingJob(TestJob):
    """A lease far shorter than the job: only heartbeats keep it."""

    class Job:
        unique_fields = ["key"]
        concurrency = 1
        lease_seconds = 2
        max_attempts = 2


class PriorityJob(TestJob):
    """One at a time; among ready jobs, the highest ``priority`` starts first."""

    priority = models.IntegerField(default=0)

    class Job:
        unique_fields = ["key"]
        priority_field = "priority"
        concurrency = 1
        lease_seconds = 60

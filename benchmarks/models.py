from __future__ import annotations

from collections.abc import Callable

from django.db import models

from django_outbox.models import BufferEvent, UniqueJob


class Order(models.Model):
    """An application row, to measure what publishing adds to a transaction."""

    customer = models.CharField(max_length=100)
    amount = models.DecimalField(max_digits=10, decimal_places=2)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"order {self.pk}"


class Marker(models.Model):
    """Written by a ping task: proves a cluster is up and taking jobs."""

    name = models.CharField(max_length=50)

    def __str__(self) -> str:
        return self.name


class NoopJob(UniqueJob):
    """A unique-job kind for ``benchmarks.unique``: one job per key, a no-op perform."""

    key = models.IntegerField()

    class Meta:
        abstract = True

    def perform(self, heartbeat: Callable[[], None]) -> None:
        """Nothing: the benchmark measures the job machinery, not the work."""


class BenchJob(NoopJob):
    """The default options but for the concurrency: 8, as in earlier runs (chunks of 4)."""

    class Job:
        unique_fields = ["key"]
        concurrency = 8
        lease_seconds = 300


class WideBenchJob(NoopJob):
    """Room for many jobs at once: concurrency 200 (chunks of 50 on 2 workers)."""

    class Job:
        unique_fields = ["key"]
        concurrency = 200
        lease_seconds = 300


class TriggeredOrder(models.Model):
    """The same row as :class:`Order`, published to the ``bench`` stream by a PublishTrigger."""

    customer = models.CharField(max_length=100)
    amount = models.DecimalField(max_digits=10, decimal_places=2)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"triggered order {self.pk}"


class OrderEvent(BufferEvent):
    """A custom buffer with the stream's defaults: the latency benchmark writes one row per
    order with ``OrderEvent.objects.create(...)``, as the documented custom-buffer path."""

    order_ref = models.IntegerField()
    amount = models.DecimalField(max_digits=10, decimal_places=2)


class KeyedEvent(BufferEvent):
    """A buffer whose rows carry an aggregate's key: the unordered side of
    ``benchmarks.ordered`` (the stream ``keyed``)."""

    aggregate = models.IntegerField()
    body = models.CharField(max_length=100)


class OrderedKeyedEvent(BufferEvent):
    """The same rows for the ordered stream ``keyed_ordered`` (``ORDER_KEY``)."""

    aggregate = models.IntegerField()
    body = models.CharField(max_length=100)

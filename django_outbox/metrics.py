"""Prometheus metrics read from the database at scrape time (extra ``metrics``).

The figures come from our tables, not from counters kept in a process, so they are right
with any number of worker processes and machines, and every query is bounded: counts
stop at ``COUNT_CAP`` (as ``outbox_status`` does) and use the tables' indexes.

Expose them with the view (``path("outbox/", include("django_outbox.urls"))`` serves
``/outbox/metrics``), open to users with the ``django_outbox.view_streamstate``
permission (the dashboard's) and to requests that carry
``Authorization: Bearer <DJANGO_OUTBOX["METRICS_TOKEN"]>``; or register
:class:`OutboxCollector` in a registry of your own.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Iterator
from typing import Any

from django.http import HttpRequest, HttpResponse, HttpResponseForbidden

from django_outbox.conf import outbox_settings
from django_outbox.streams.status import COUNT_CAP, all_statuses, staged_counts, unique_job_counts

__all__ = [
    "OutboxCollector",
    "metrics_view",
]

_GROUP_STATES = ("claimed", "running", "retrying", "dead_lettering")


class OutboxCollector:
    """A ``prometheus_client`` collector over the app's tables."""

    def __init__(self, cap: int = COUNT_CAP) -> None:
        self.cap = cap

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        started = time.perf_counter()
        backlog = GaugeMetricFamily(
            "django_outbox_backlog_rows",
            f"Unclaimed rows per stream (a bounded count: at most {self.cap}).",
            labels=["stream"],
        )
        lag = GaugeMetricFamily(
            "django_outbox_oldest_unclaimed_age_seconds",
            "Age of the oldest unclaimed row per stream (0 when the buffer is empty).",
            labels=["stream"],
        )
        paused = GaugeMetricFamily(
            "django_outbox_stream_paused", "1 when the stream is paused.", labels=["stream"]
        )
        groups = GaugeMetricFamily(
            "django_outbox_groups", "Groups per stream and state.", labels=["stream", "state"]
        )
        isolating = GaugeMetricFamily(
            "django_outbox_isolating_groups",
            "Groups per stream split from a group that failed as a whole (failure isolation).",
            labels=["stream"],
        )
        held = GaugeMetricFamily(
            "django_outbox_held_keys",
            "Keys of an ordered stream held back by a dead letter (bounded count).",
            labels=["stream"],
        )
        budget = GaugeMetricFamily(
            "django_outbox_calls_per_second_budget",
            "The stream's rate budget (CALLS_PER_SECOND); streams without one are not listed.",
            labels=["stream"],
        )
        budget_calls = CounterMetricFamily(
            "django_outbox_budget_calls",
            "Handler calls made under the stream's rate budget (rate() is the observed "
            "calls per second).",
            labels=["stream"],
        )
        row_budget = GaugeMetricFamily(
            "django_outbox_rows_per_second_budget",
            "The stream's row budget (ROWS_PER_SECOND); streams without one are not listed.",
            labels=["stream"],
        )
        budget_rows = CounterMetricFamily(
            "django_outbox_budget_rows",
            "Rows handed to the handler under the stream's row budget (rate() is the "
            "observed rows per second).",
            labels=["stream"],
        )
        pause = GaugeMetricFamily(
            "django_outbox_stream_pause_seconds",
            "Seconds left of the pause a handler asked for (RetryAfter); 0 when none.",
            labels=["stream"],
        )
        archived = GaugeMetricFamily(
            "django_outbox_archived_last_hour_rows",
            "Rows archived per stream and outcome over the last hour (bounded count).",
            labels=["stream", "outcome"],
        )
        for status in all_statuses():
            stream = status.stream
            backlog.add_metric([stream], status.backlog)
            lag.add_metric([stream], status.lag_seconds or 0.0)
            paused.add_metric([stream], 1 if status.paused else 0)
            for state in _GROUP_STATES:
                groups.add_metric([stream, state], getattr(status, f"groups_{state}"))
            isolating.add_metric([stream], status.groups_isolating)
            held.add_metric([stream], status.held_keys)
            pause.add_metric([stream], status.pause_seconds)
            if status.calls_per_second is not None:
                budget.add_metric([stream], status.calls_per_second)
                budget_calls.add_metric([stream], status.budget_calls)
            if status.rows_per_second is not None:
                row_budget.add_metric([stream], status.rows_per_second)
                budget_rows.add_metric([stream], status.budget_rows)
            archived.add_metric([stream, "done"], status.archived_last_hour)
            archived.add_metric([stream, "failed"], status.failed_last_hour)
        yield from (backlog, lag, paused, groups, isolating, held, archived)
        yield from (pause, budget, budget_calls, row_budget, budget_rows)
        yield from self._staged()
        yield from self._unique_jobs()
        yield GaugeMetricFamily(
            "django_outbox_scrape_duration_seconds",
            "Time spent reading the metrics from the database.",
            value=time.perf_counter() - started,
        )

    def _staged(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        staged = GaugeMetricFamily(
            "django_outbox_staged_jobs",
            "Staged jobs waiting for the drainer, forwarded and not yet run (Redis), and kept "
            "with an error (bounded count).",
            labels=["state"],
        )
        for state, count in staged_counts(self.cap).items():
            staged.add_metric([state], count)
        yield staged

    def _unique_jobs(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        family = GaugeMetricFamily(
            "django_outbox_unique_jobs",
            "Unique jobs per kind and state (dispatched: handed to a worker, not started; "
            "bounded count).",
            labels=["kind", "state"],
        )
        for kind, state, count in unique_job_counts(self.cap):
            family.add_metric([kind, state], count)
        yield family


def render() -> tuple[bytes, str]:
    """The exposition text of our metrics alone, and its content type."""
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(OutboxCollector())
    return generate_latest(registry), CONTENT_TYPE_LATEST


#: The permission a logged-in user needs to read the metrics (the dashboard's own).
_VIEW_PERMISSION = "django_outbox.view_streamstate"


def allowed(request: HttpRequest) -> bool:
    """Users who may view the outbox dashboard, or the bearer of ``METRICS_TOKEN``."""
    user = getattr(request, "user", None)
    if user is not None and user.is_active and user.has_perm(_VIEW_PERMISSION):
        return True
    token = outbox_settings().metrics_token
    header = request.headers.get("Authorization", "")
    return bool(token) and hmac.compare_digest(header.encode(), f"Bearer {token}".encode())


def metrics_view(request: HttpRequest) -> HttpResponse:
    if not allowed(request):
        return HttpResponseForbidden(
            f"A login with the {_VIEW_PERMISSION} permission or 'Authorization: Bearer "
            "<METRICS_TOKEN>' required.\n",
            content_type="text/plain",
        )
    try:
        body, content_type = render()
    except ImportError:
        return HttpResponse(
            "prometheus-client is not installed: pip install 'django-outbox-batching[metrics]'.\n",
            status=501,
            content_type="text/plain",
        )
    return HttpResponse(body, content_type=content_type)

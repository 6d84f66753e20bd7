"""OpenTelemetry tracing, when the ``opentelemetry-api`` package is installed.

``pip install "django-outbox-batching[otel]"`` installs it. Without it every function
here is a cheap no-op and nothing changes. With it, it is imported with this module
(when Django loads the models), not in the middle of a worker's first batch. With the
API but no SDK configured, spans are the API's non-recording spans and nothing is
stored either.

* **Producers.** A buffer row, a staged job or a unique job (a task too) records the
  W3C ``traceparent`` of the span that is recording where it is written
  (:func:`current_traceparent`), in its ``trace_context`` column; rows written outside
  a recording span keep NULL.
* **Handlers.** Each handler call runs in a span ``django_outbox.deliver <stream>``
  (:func:`deliver`) whose links point at the producers' spans: the contexts are read from
  the rows the handler reads itself (``batch.rows()``, ``batch.events``), never by a
  query of their own, at most :data:`MAX_LINKS` of them, with the number of distinct
  producer contexts as the attribute ``django_outbox.producers``.
* **Jobs.** A staged job, a task or a unique job of any kind runs in a span that is a
  child of its enqueuer's (:func:`continued`): one span per job, also when one
  statement started several.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

__all__ = [
    "MAX_LINKS",
    "current_traceparent",
]

#: At most this many links on one delivery span (a group may hold thousands of rows).
MAX_LINKS = 32
#: The instrumentation scope of our spans.
SCOPE = "django_outbox"

_installed: Any
try:  # at import, so that forked workers (django-q2) share it: no import mid-work
    from opentelemetry import trace as _installed
except ImportError:
    _installed = False
#: The ``opentelemetry.trace`` module; False when missing, None to look it up again.
_api: Any = _installed
_tracer: Any = None  # our tracer, once asked for (a proxy until an SDK is configured)


def _trace() -> Any:
    """The ``opentelemetry.trace`` module, or None when the API is not installed."""
    global _api
    if _api is None:
        found: Any
        try:
            from opentelemetry import trace as found
        except ImportError:
            found = False
        _api = found
    return _api or None


def _our_tracer(trace: Any) -> Any:
    global _tracer
    if _tracer is None:
        _tracer = trace.get_tracer(SCOPE)
    return _tracer


def current_traceparent() -> str | None:
    """The W3C ``traceparent`` of the recording span of this context, else None.

    The default of every buffer model's ``trace_context`` column, so that rows created
    through the ORM record their producer as ``publish()`` does.
    """
    trace = _trace()
    if trace is None:
        return None
    span = trace.get_current_span()
    if not span.is_recording():
        return None
    context = span.get_span_context()
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def span_context(traceparent: Any) -> Any:
    """The remote ``SpanContext`` a stored ``traceparent`` names, or None if it names none."""
    trace = _trace()
    if trace is None or not isinstance(traceparent, str):
        return None
    parts = traceparent.split("-")
    if len(parts) != 4 or len(parts[1]) != 32 or len(parts[2]) != 16:
        return None
    try:
        trace_id, span_id, flags = int(parts[1], 16), int(parts[2], 16), int(parts[3], 16)
    except ValueError:
        return None
    if not trace_id or not span_id:
        return None
    return trace.SpanContext(trace_id, span_id, is_remote=True, trace_flags=trace.TraceFlags(flags))


class Links:
    """The producers of the rows a handler read, added as links to its delivery span."""

    def __init__(self, span: Any) -> None:
        self.span = span
        self.seen: set[str] = set()
        self.rows = 0

    def read(self, traceparents: Iterable[Any], rows: int) -> None:
        """Note rows the handler read (*rows* of them) and their stored contexts."""
        self.rows = max(self.rows, rows)
        for traceparent in traceparents:
            if traceparent is None or traceparent in self.seen:
                continue
            self.seen.add(traceparent)
            if len(self.seen) <= MAX_LINKS:
                context = span_context(traceparent)
                if context is not None:
                    self.span.add_link(context)

    def close(self) -> None:
        if self.rows:
            self.span.set_attribute("django_outbox.rows", self.rows)
        self.span.set_attribute("django_outbox.producers", len(self.seen))


@contextlib.contextmanager
def deliver(stream: str, group_id: Any, attempt: int, split_depth: int) -> Iterator[Any]:
    """Run a handler call in the span ``django_outbox.deliver <stream>``.

    Yields a :class:`Links` to give the rows the handler reads, or None when no span
    records (no API, no SDK, not sampled): then nothing is collected.
    """
    trace = _trace()
    if trace is None:
        yield None
        return
    tracer = _our_tracer(trace)
    attributes = {
        "django_outbox.stream": stream,
        "django_outbox.group_id": str(group_id),
        "django_outbox.attempt": attempt,
        "django_outbox.split_depth": split_depth,
    }
    with tracer.start_as_current_span(f"{SCOPE}.deliver {stream}", attributes=attributes) as span:
        if not span.is_recording():
            yield None
            return
        links = Links(span)
        try:
            yield links
        finally:
            links.close()


def outcome(links: Links | None, value: str) -> None:
    """Record the attempt's outcome on its delivery span."""
    if links is not None:
        links.span.set_attribute("django_outbox.outcome", value)


@contextlib.contextmanager
def continued(name: str, traceparent: Any, attributes: dict[str, Any]) -> Iterator[None]:
    """Run a job in a span *name*, the child of the span that enqueued it (if any)."""
    trace = _trace()
    if trace is None:
        yield
        return
    parent = span_context(traceparent)
    context = trace.set_span_in_context(trace.NonRecordingSpan(parent)) if parent else None
    tracer = _our_tracer(trace)
    with tracer.start_as_current_span(name, context=context, attributes=attributes):
        yield

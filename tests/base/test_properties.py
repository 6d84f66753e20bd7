"""Property tests: whatever a caller passes, it is refused clearly or given back as JSON.

Arbitrary values (JSON and not: nested containers, NaN and infinity, big integers, bytes,
sets, datetimes, NUL characters, lone surrogates) go to ``publish``, ``publish_many``,
``stage_task``, ``idempotent`` and ``UniqueJob.enqueue``. Each call either raises the
library's documented exception and writes nothing, or stores the value so that reading it
back gives what ``json.loads(json.dumps(value))`` would.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import transaction
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from django_outbox import publish, publish_many
from django_outbox.base.dialect import database_now
from django_outbox.base.durations import MAX_DURATION, validate_duration
from django_outbox.base.jsondata import MAX_DEPTH
from django_outbox.exceptions import (
    DurationError,
    IdempotencyError,
    JobError,
    OutboxError,
    PayloadError,
    StagingError,
    UnknownStream,
)
from django_outbox.jobs.idempotency import idempotent
from django_outbox.jobs.staging import stage_task
from django_outbox.models import ArchivedEvent, IdempotencyKey, OutboxEvent, StagedJob
from tests.uniqueapp.models import KeyedJob

pytestmark = pytest.mark.django_db

PROPERTY = hypothesis_settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# -- values ----------------------------------------------------------------------------

ODD_TEXT = ["\x00", "nul\x00", "\ud800", "\udfff", "\\u0000", "\U0001f600", "\u2028", "é" * 65]
texts = st.text(st.characters(exclude_categories=()), max_size=12) | st.sampled_from(ODD_TEXT)
numbers = (
    st.integers()
    | st.integers(min_value=2**63 - 2, max_value=2**64)
    | st.sampled_from([10**30, -(10**30), 10**4000])
    | st.floats()
    | st.sampled_from([math.nan, math.inf, -math.inf, -0.0, 1e308, 5e-324, 4.016827333788903e16])
)
json_scalars = st.none() | st.booleans() | numbers | texts
other_scalars = (
    st.binary(max_size=4)
    | st.sets(st.integers(), max_size=2)
    | st.datetimes()
    | st.just(Decimal("1.5"))
    | st.just(object())
)
keys = texts | st.integers() | st.booleans() | st.none() | st.floats() | st.tuples(st.integers())


def nested(depth: int) -> Any:
    value: Any = "bottom"
    for level in range(depth):
        value = [value] if level % 2 else {"x": value}
    return value


def contains_itself() -> list:
    value: list = []
    value.append(value)
    return value


values = (
    st.recursive(
        json_scalars | other_scalars,
        lambda children: (
            st.lists(children, max_size=4)
            | st.tuples(children, children)
            | st.dictionaries(keys, children, max_size=4)
        ),
        max_leaves=12,
    )
    | st.integers(MAX_DEPTH - 2, MAX_DEPTH + 2).map(nested)
    | st.builds(contains_itself)
)


def as_json(value: Any, encoder: type[json.JSONEncoder] | None = None) -> Any:
    """What JSON gives back for *value*; raise TypeError/ValueError if it is not JSON."""
    return json.loads(json.dumps(value, allow_nan=False, cls=encoder))


def as_django_json(value: Any) -> Any:
    """The same through ``DjangoJSONEncoder``, as payloads and staged arguments are
    stored: datetimes, Decimals and UUIDs become the strings that encoder writes."""
    return as_json(value, DjangoJSONEncoder)


def same_json(stored: Any, expected: Any) -> bool:
    """Whether *stored* is *expected* as JSON: numbers compare by value.

    PostgreSQL's jsonb keeps a number's decimal value, not Python's int/float split:
    ``4.016827333788903e+16`` comes back as the integer ``40168273337889030``.
    """
    if isinstance(expected, float) and isinstance(stored, (int, float)):
        return not isinstance(stored, bool) and float(stored) == expected
    if isinstance(expected, dict):
        return (
            isinstance(stored, dict)
            and stored.keys() == expected.keys()
            and all(same_json(stored[key], expected[key]) for key in expected)
        )
    if isinstance(expected, list):
        return (
            isinstance(stored, list)
            and len(stored) == len(expected)
            and all(same_json(a, b) for a, b in zip(stored, expected, strict=True))
        )
    return type(stored) is type(expected) and stored == expected


def is_json(value: Any, convert: Any = as_json) -> bool:
    try:
        convert(value)
    except (TypeError, ValueError, RecursionError):
        return False
    return True


def is_django_json(value: Any) -> bool:
    return is_json(value, as_django_json)


class _RolledBack(Exception):
    pass


@contextmanager
def rolled_back() -> Iterator[None]:
    """Run one example in a savepoint that is rolled back, so examples never meet."""
    try:
        with transaction.atomic():
            yield
            raise _RolledBack
    except _RolledBack:
        pass


# -- publish ---------------------------------------------------------------------------


@PROPERTY
@given(payload=values)
def test_publish_refuses_a_payload_or_archives_it_as_json_gives_it_back(payload, inline):
    with rolled_back():
        try:
            publish("audit", payload)
        except OutboxError as exc:
            assert isinstance(exc, PayloadError), exc
            assert not OutboxEvent.objects.exists()
            return
        assert is_django_json(payload), "a value DjangoJSONEncoder cannot write was accepted"

        inline.distribute("audit")

        archived = ArchivedEvent.objects.get(stream="audit").data["payload"]
        assert same_json(archived, as_django_json(payload)), (archived, payload)


@PROPERTY
@given(payloads=st.lists(values, max_size=3))
def test_publish_many_refuses_all_or_stores_each_as_json_gives_it_back(payloads):
    with rolled_back():
        try:
            publish_many("audit", payloads)
        except OutboxError as exc:
            assert isinstance(exc, PayloadError), exc
            assert not OutboxEvent.objects.exists()
            return
        stored = [row.payload for row in OutboxEvent.objects.order_by("id")]
        assert same_json(stored, [as_django_json(payload) for payload in payloads]), stored


@PROPERTY
@given(stream=texts | st.integers() | st.none() | st.lists(st.integers(), max_size=2))
def test_publish_to_a_stream_that_is_not_configured_names_the_configured_ones(stream):
    if isinstance(stream, str) and stream in settings.DJANGO_OUTBOX["STREAMS"]:
        return
    with rolled_back():
        with pytest.raises(UnknownStream, match="Configured streams: audit, marketing"):
            publish(stream, {})
        with pytest.raises(UnknownStream):
            publish_many(stream, [{}])
        assert not OutboxEvent.objects.exists()


# -- stage_task ------------------------------------------------------------------------


@PROPERTY
@given(value=values, keyword=values)
def test_stage_task_refuses_arguments_or_stores_them_as_json_gives_them_back(value, keyword):
    with rolled_back():
        try:
            stage_task(
                "tests.testapp.jobs.record_kwargs",
                "label",
                value,
                extra=keyword,
                run_after=timedelta(hours=1),
            )
        except OutboxError as exc:
            assert isinstance(exc, StagingError), exc
            assert not StagedJob.objects.exists()
            return
        assert is_django_json(value) and is_django_json(keyword), (
            "a value DjangoJSONEncoder cannot write was accepted"
        )
        job = StagedJob.objects.get()
        assert same_json(job.args, as_django_json(["label", value])), job.args
        assert same_json(job.kwargs, {"extra": as_django_json(keyword)}), job.kwargs


# -- idempotent --------------------------------------------------------------------------

ttls = (
    st.none()
    | st.timedeltas(min_value=timedelta(0), max_value=MAX_DURATION)
    | st.timedeltas()
    | st.floats()
    | st.integers(min_value=-(10**12), max_value=10**12)
)


@PROPERTY
@given(result=values, ttl=ttls)
def test_idempotent_refuses_a_result_or_keeps_it_as_json_gives_it_back(result, ttl):
    with rolled_back():
        try:
            with idempotent(key="k", scope="properties", ttl=ttl) as guard:
                guard.result = result
        except OutboxError as exc:
            assert isinstance(exc, (IdempotencyError, DurationError)), exc
            assert not IdempotencyKey.objects.exists()
            return
        assert is_json(result), "a result that is not JSON was kept"
        key = IdempotencyKey.objects.get()
        assert same_json(key.result, as_json(result)), key.result
        seconds = 7 * 86400.0 if ttl is None else validate_duration("ttl", ttl)
        lifetime = key.expires_at - key.completed_at
        assert abs(lifetime - timedelta(seconds=seconds)) < timedelta(seconds=1)


# -- unique enqueue ----------------------------------------------------------------------

delays = (
    st.none()
    | st.timedeltas()
    | st.sampled_from([timedelta(seconds=-5), timedelta.max, timedelta.min, timedelta(days=36_500)])
)
process_afters = (
    delays
    | st.datetimes(timezones=st.just(UTC), min_value=datetime(1, 1, 2))
    | st.datetimes()
    | st.sampled_from([math.nan, -1, 5])
)


@PROPERTY
@given(
    key=texts,
    note=texts,
    seq=st.integers() | st.sampled_from([2**31, -(2**31) - 1, 2**63]),
    work_seconds=numbers,
    process_after=process_afters,
)
def test_enqueue_refuses_fields_or_stores_them_as_given(
    key, note, seq, work_seconds, process_after
):
    fields = {"key": key, "note": note, "seq": seq, "work_seconds": work_seconds}
    with rolled_back():
        before = database_now()
        try:
            job, created = KeyedJob.enqueue(**fields, process_after=process_after)
        except OutboxError as exc:
            assert isinstance(exc, (JobError, DurationError)), exc
            assert not KeyedJob.objects.exists()
            return
        assert created
        stored = KeyedJob.objects.get(pk=job.pk)
        assert (stored.key, stored.note, stored.seq) == (key, note, seq)
        assert stored.work_seconds == float(work_seconds)  # a FloatField: a float
        if process_after is None or isinstance(process_after, timedelta):
            delay = max(process_after or timedelta(0), timedelta(0))
            assert stored.process_after >= before + delay - timedelta(seconds=1)
        else:
            assert stored.process_after == process_after

"""OpenTelemetry: producers record their trace context, handler calls run in linked spans.

The SDK's in-memory exporter collects the spans. The provider is installed once for the
session (OpenTelemetry allows one); code outside a span records nothing, so the other
tests are unaffected.
"""

from __future__ import annotations

import copy
import subprocess
import sys
import uuid

import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from django_outbox import publish, publish_many
from django_outbox.base import tracing
from django_outbox.conf import get_stream
from django_outbox.models import ArchivedEvent, OutboxEvent
from django_outbox.streams.batch import Batch
from django_outbox.transport import handoff
from marketing.models import ContactActivity, ContactActivityEvent, Lead
from tests.procs import ROOT, child_env
from tests.testapp.models import JobEffect

pytestmark = pytest.mark.django_db

EXPORTER = InMemorySpanExporter()
GROUP = uuid.UUID("00000000-0000-0000-0000-000000000001")


_INSTALLED: list[bool] = []


@pytest.fixture(scope="module", autouse=True)
def _provider():
    """Export to EXPORTER once per session. pytest-django runs transactional tests after
    the others, so this module's fixture can be set up twice in one session; a second
    processor would export every span twice."""
    if not _INSTALLED:
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
        trace.set_tracer_provider(provider)
        if trace.get_tracer_provider() is not provider:  # set earlier in this session
            trace.get_tracer_provider().add_span_processor(SimpleSpanProcessor(EXPORTER))
        _INSTALLED.append(True)
    yield


@pytest.fixture
def spans():
    EXPORTER.clear()
    yield EXPORTER
    EXPORTER.clear()


def traceparent(span) -> str:
    context = span.get_span_context()
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def tracer():
    return trace.get_tracer("tests")


def deliveries(spans):
    return [s for s in spans.get_finished_spans() if s.name.startswith("django_outbox.deliver")]


def test_publish_records_the_recording_spans_traceparent_in_its_one_insert():
    with tracer().start_as_current_span("request") as span:
        with CaptureQueriesContext(connection) as captured:
            event_id = publish("audit", {"n": 1})
        publish_many("audit", [{"n": 2}])
    untraced = publish("audit", {"n": 3})

    assert len(captured.captured_queries) == 1
    rows = dict(OutboxEvent.objects.values_list("id", "trace_context"))
    assert rows[event_id] == traceparent(span)
    assert sorted(rows.values(), key=str) == [traceparent(span), traceparent(span), None]
    assert rows[untraced] is None


def test_orm_writes_of_a_buffer_model_record_it_too():
    lead = Lead.objects.create(name="Ada", email="ada@example.com")
    activity = ContactActivity.objects.create(lead=lead, kind="call")
    with tracer().start_as_current_span("signup") as span:
        created = ContactActivityEvent.objects.create(activity=activity)
        ContactActivityEvent.objects.bulk_create([ContactActivityEvent(activity=activity)])
    assert set(ContactActivityEvent.objects.values_list("trace_context", flat=True)) == {
        traceparent(span)
    }
    assert created.trace_context == traceparent(span)


def test_a_handler_call_runs_in_a_span_linked_to_its_producers(inline, spans):
    producers = []
    for n in range(2):
        with tracer().start_as_current_span(f"request {n}") as span:
            publish_many("audit", [{"n": n}, {"n": n + 10}])
        producers.append(span.get_span_context())
    publish("audit", {"untraced": True})

    inline.distribute("audit")

    [delivery] = deliveries(spans)
    assert delivery.name == "django_outbox.deliver audit"
    archived = ArchivedEvent.objects.filter(stream="audit")
    assert delivery.attributes == {
        "django_outbox.stream": "audit",
        "django_outbox.group_id": str(archived.first().group_id),
        "django_outbox.attempt": 1,
        "django_outbox.split_depth": 0,
        "django_outbox.rows": 5,
        "django_outbox.producers": 2,
        "django_outbox.outcome": "done",
    }
    linked = [(link.context.trace_id, link.context.span_id) for link in delivery.links]
    assert linked == [(c.trace_id, c.span_id) for c in producers]
    assert archived.count() == 5


def test_links_are_capped_and_the_producers_counted(inline, spans):
    outbox = copy.deepcopy(settings.DJANGO_OUTBOX)
    outbox["STREAMS"]["audit"]["BATCH_SIZE"] = 100
    for n in range(tracing.MAX_LINKS + 8):
        with tracer().start_as_current_span(f"request {n}"):
            publish("audit", {"n": n})

    with override_settings(DJANGO_OUTBOX=outbox):
        inline.distribute("audit")

    [delivery] = deliveries(spans)
    assert delivery.attributes["django_outbox.producers"] == tracing.MAX_LINKS + 8
    assert len(delivery.links) == tracing.MAX_LINKS


def test_a_handler_reading_events_links_them_and_a_failed_attempt_says_so(
    inline, spans, handler_mode
):
    with tracer().start_as_current_span("request") as producer:
        publish("audit", {"n": 1})
    handler_mode("raise")

    inline.distribute("audit")

    [delivery] = deliveries(spans)
    assert delivery.attributes["django_outbox.outcome"] == "retrying"
    assert [link.context.span_id for link in delivery.links] == [
        producer.get_span_context().span_id
    ]


def test_batch_events_feed_the_links_without_a_query_of_their_own(spans):
    with tracer().start_as_current_span("request") as producer:
        publish("audit", {"n": 1})
    OutboxEvent.objects.update(group_id=GROUP)
    with tracer().start_as_current_span("deliver") as span:
        links = tracing.Links(span)
        batch = Batch(get_stream("audit"), GROUP, 1, links=links)
        with CaptureQueriesContext(connection) as captured:
            assert [event.payload for event in batch.events] == [{"n": 1}]
        links.close()
    assert len(captured.captured_queries) == 1
    [delivery] = [s for s in spans.get_finished_spans() if s.name == "deliver"]
    assert delivery.attributes["django_outbox.producers"] == 1
    assert delivery.links[0].context.span_id == producer.get_span_context().span_id


def test_without_a_recording_span_nothing_is_collected():
    assert tracing.current_traceparent() is None
    with tracing.deliver("audit", GROUP, 1, 0) as links:
        assert links is not None  # the SDK records
    with trace.use_span(trace.INVALID_SPAN):
        assert tracing.current_traceparent() is None


@pytest.mark.parametrize(
    "value", [None, "", "garbage", "00-" + "0" * 32 + "-" + "1" * 16 + "-01", 42]
)
def test_a_stored_value_that_is_no_traceparent_is_ignored(value):
    assert tracing.span_context(value) is None


def test_without_opentelemetry_publish_works_and_records_nothing(monkeypatch, inline):
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    monkeypatch.setattr(tracing, "_api", None)  # looked up again: the import fails
    with trace.get_tracer("tests").start_as_current_span("request"):
        event_id = publish("audit", {"n": 1})
        with tracing.deliver("audit", GROUP, 1, 0) as links:
            assert links is None
    assert OutboxEvent.objects.get(pk=event_id).trace_context is None
    inline.distribute("audit")
    assert ArchivedEvent.objects.filter(stream="audit").count() == 1
    assert tracing._api is False


@pytest.mark.django_db(transaction=True)
def test_the_package_imports_and_publishes_where_opentelemetry_cannot_be_imported():
    code = (
        "import sys; sys.modules['opentelemetry'] = None\n"
        "import django; django.setup()\n"
        "from django_outbox import publish\n"
        "from django_outbox.base import tracing\n"
        "import django_outbox.streams.attempt, django_outbox.streams.batch\n"
        "import django_outbox.jobs.staging\n"
        "event_id = publish('audit', {'n': 1})\n"
        "from django_outbox.models import OutboxEvent\n"
        "assert OutboxEvent.objects.get(pk=event_id).trace_context is None\n"
        "assert tracing._api is False\n"
        "assert not [m for m in sys.modules if m.startswith('opentelemetry.')]\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=child_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (done.returncode, done.stdout.strip()) == (0, "ok"), done.stderr
    assert OutboxEvent.objects.count() == 1


# -- staged jobs and tasks continue their enqueuer's trace -----------------------------

RECORD = "tests.testapp.jobs.record"


def run_captured(queue) -> None:
    while queue:
        queue.popleft().run()


def only_span(spans, prefix: str):
    [span] = [s for s in spans.get_finished_spans() if s.name.startswith(prefix)]
    return span


@pytest.mark.parametrize("how", ["handed-off", "drained", "keyed"])
def test_a_staged_job_runs_in_a_child_of_the_span_that_staged_it(spans, how):
    from django_outbox.jobs import staging

    outbox = copy.deepcopy(settings.DJANGO_OUTBOX)
    outbox["STAGING"]["FORWARD_ON_COMMIT"] = how != "drained"
    key = {"idempotency_key": "receipt:1"} if how == "keyed" else {}
    with override_settings(DJANGO_OUTBOX=outbox), handoff.capture() as queue:
        with tracer().start_as_current_span("request") as producer:
            staging.stage_task(RECORD, "traced", **key)
        staging.drain()
        assert [job.func for job in queue] == [staging.TRACED_RUNNER]
        run_captured(queue)

    assert JobEffect.objects.get().label == "traced"
    job_span = only_span(spans, "django_outbox.staged")
    assert job_span.name == f"django_outbox.staged {RECORD}"
    assert job_span.parent.span_id == producer.get_span_context().span_id
    assert job_span.context.trace_id == producer.get_span_context().trace_id


def test_a_job_staged_outside_a_span_is_forwarded_as_before(spans):
    from django_outbox.jobs import staging

    with handoff.capture() as queue:
        staging.stage_task(RECORD, "plain")
        assert [job.func for job in queue] == [RECORD]
        run_captured(queue)
    assert not [s for s in spans.get_finished_spans() if s.name.startswith("django_outbox")]


def test_the_traced_runner_refuses_a_function_outside_the_allowed_modules():
    from django_outbox.exceptions import StagingError
    from django_outbox.tasks import run_traced

    with pytest.raises(StagingError, match="not in an allowed module"):
        run_traced("00-" + "1" * 32 + "-" + "2" * 16 + "-01", "os.system", ["true"])


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(not settings.TASKS_AVAILABLE, reason="django.tasks needs Django 6.0+")
def test_a_task_runs_in_a_child_of_the_span_that_enqueued_it(spans):
    from tests.taskfuncs import record

    with handoff.capture() as queue:
        with tracer().start_as_current_span("request") as producer:
            record.enqueue("traced task")
        run_captured(queue)

    assert JobEffect.objects.get().label == "traced task"
    task_span = only_span(spans, "django.tasks")
    assert task_span.name == "django.tasks tests.taskfuncs.record"
    assert task_span.parent.span_id == producer.get_span_context().span_id
    assert task_span.attributes["django_outbox.attempt"] == 1


# -- unique-job kinds continue their enqueuer's trace ----------------------------------


def columns(insert: str) -> str:
    """The column list of an INSERT statement (not its RETURNING clause)."""
    return insert.split(")", 1)[0]


@pytest.mark.django_db(transaction=True)
def test_enqueue_records_the_recording_spans_traceparent_in_its_one_insert(spans):
    from tests.uniqueapp.models import KeyedJob

    with handoff.capture(), CaptureQueriesContext(connection) as queries:
        with tracer().start_as_current_span("request") as producer:
            job, created = KeyedJob.enqueue(key="traced")
    inserts = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("INSERT")]
    assert created and len(inserts) == 1 and "trace_context" in columns(inserts[0])
    assert KeyedJob.objects.get(pk=job.pk).trace_context == traceparent(producer)

    with handoff.capture(), CaptureQueriesContext(connection) as queries:
        plain, _ = KeyedJob.enqueue(key="plain")  # no span: the INSERT as before
    inserts = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("INSERT")]
    assert len(inserts) == 1 and "trace_context" not in columns(inserts[0])
    assert KeyedJob.objects.get(pk=plain.pk).trace_context is None


@pytest.mark.django_db(transaction=True)
def test_a_unique_job_runs_in_a_child_of_the_span_that_enqueued_it(spans):
    from tests.uniqueapp.models import JobRun, KeyedJob

    with handoff.capture() as queue:
        with tracer().start_as_current_span("request") as producer:
            KeyedJob.enqueue(key="traced")
        run_captured(queue)

    assert JobRun.objects.get().key == "traced"
    job_span = only_span(spans, "django_outbox.job")
    assert job_span.name == "django_outbox.job uniqueapp.KeyedJob"
    assert job_span.parent.span_id == producer.get_span_context().span_id
    assert job_span.context.trace_id == producer.get_span_context().trace_id
    assert job_span.attributes["django_outbox.kind"] == "uniqueapp.KeyedJob"
    assert job_span.attributes["django_outbox.attempt"] == 1


@pytest.mark.django_db(transaction=True)
def test_jobs_started_by_one_statement_each_continue_their_own_enqueuer(spans):
    """A chunk starts 8 jobs in one statement; each runs in a span of its own, the
    child of the span that enqueued that job (enqueue_many: of the span around it)."""
    from django_outbox.models import JobState
    from django_outbox.unique.execute import JobOutcome, execute_chunk
    from tests.uniqueapp.models import KeyedJob

    assert KeyedJob.job_options().jobs_per_statement == 8
    producers = {}
    with handoff.capture():
        for n in range(6):
            with tracer().start_as_current_span(f"request {n}") as span:
                job, _ = KeyedJob.enqueue(key=f"k{n}")
            producers[job.pk] = span
        with tracer().start_as_current_span("bulk") as bulk:
            for job in KeyedJob.enqueue_many([{"key": "k6"}, {"key": "k7"}]):
                producers[job.pk] = bulk
    pks = sorted(producers)
    KeyedJob.objects.update(state=JobState.RUNNING, attempt=1, started_at=None)
    outcomes = execute_chunk(KeyedJob, [(pk, 1) for pk in pks])
    assert outcomes == [JobOutcome.PROCESSED] * 8

    job_spans = {
        int(s.attributes["django_outbox.job_id"]): s
        for s in spans.get_finished_spans()
        if s.name.startswith("django_outbox.job")
    }
    assert sorted(job_spans) == pks
    for pk, span in job_spans.items():
        assert span.parent.span_id == producers[pk].get_span_context().span_id
        assert span.context.trace_id == producers[pk].get_span_context().trace_id


@pytest.mark.django_db(transaction=True)
def test_a_unique_job_enqueued_outside_a_span_starts_a_trace_of_its_own(spans):
    from tests.uniqueapp.models import KeyedJob

    with handoff.capture() as queue:
        KeyedJob.enqueue(key="plain")
        run_captured(queue)
    job_span = only_span(spans, "django_outbox.job")
    assert job_span.parent is None

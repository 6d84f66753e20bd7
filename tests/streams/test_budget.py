"""Rate budgets and pauses: ``CALLS_PER_SECOND`` and ``RetryAfter`` (django_outbox.streams.budget).

A handler that raises or returns ``RetryAfter`` pauses its stream without spending the
group's attempt; a stream with ``CALLS_PER_SECOND`` starts its handler calls at least
``1 / CALLS_PER_SECOND`` apart, whatever the number of workers. Calls are timed by the
database's clock; the assertions bound the calls from the start of the run (a call may
be late, never early), so a slow machine cannot make them fail.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from io import StringIO

import pytest
from django.conf import settings
from django.core.checks import run_checks
from django.core.management import call_command
from django.db import connection, connections
from django.db.models.functions import Now
from django.test import override_settings
from django.urls import reverse

from django_outbox import RetryAfter, publish, publish_many
from django_outbox.base.dialect import database_now
from django_outbox.models import ArchivedEvent, GroupState, OutboxEvent, OutboxGroup, StreamState
from django_outbox.streams import budget
from django_outbox.streams.attempt import AttemptOutcome
from django_outbox.streams.distribute import distribute_stream
from django_outbox.streams.run import claim_group, run_stream, start_runs
from django_outbox.streams.status import stream_status
from django_outbox.transport import handoff
from tests.conftest import InlineRunner, publish_unwoken
from tests.procs import (
    fail_on_queue_failures,
    log_problems,
    qcluster,
    running,
    wait_until,
)
from tests.testapp.models import HandledCall, JobEffect

pytestmark = pytest.mark.django_db(transaction=True)

AUDIT = {
    "HANDLER": "tests.testapp.handlers.record",
    "BATCH_SIZE": 2,
    "RUNS": 2,
    "MAX_ATTEMPTS": 3,
    "BACKOFF_SECONDS": 1,
    "LEASE_SECONDS": 120,
}
PACED = settings.PACED_STREAM


def streams(**extra):
    return override_settings(
        DJANGO_OUTBOX={**settings.DJANGO_OUTBOX, "STREAMS": {"audit": AUDIT, **extra}}
    )


def pass_the_pause(stream: str) -> None:
    """Let the pause end: move it, and the groups waiting for it, into the past."""
    past = Now() - timedelta(seconds=1)
    StreamState.objects.filter(stream=stream).update(paused_until=past, next_call_at=past)
    OutboxGroup.objects.filter(stream=stream, state=GroupState.RETRYING).update(
        next_attempt_at=past
    )


# -- RetryAfter --------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["retry-after", "return-retry-after"])
def test_retry_after_pauses_the_stream_and_keeps_the_attempt(handler_mode, mode):
    handler_mode(mode)
    runner = InlineRunner()
    with streams(), runner.capturing():
        publish_many("audit", [{"n": n} for n in range(6)])  # three groups of two
    runner.drain()

    # One call, then the whole stream waits: no other group reached the handler.
    calls = list(HandledCall.objects.values_list("attempt", flat=True))
    assert calls == [1]
    group = OutboxGroup.objects.get()
    assert group.state == GroupState.RETRYING
    assert group.attempt == 0  # taking it again makes it attempt 1 again: none spent
    assert group.size == 2 and group.split_depth == 0  # RetryAfter never splits
    assert "429 Too Many Requests" in group.last_error
    state = StreamState.objects.get(stream="audit")
    assert state.paused_until is not None
    assert 29 < (state.paused_until - database_now()).total_seconds() <= 30
    assert group.next_attempt_at == state.paused_until
    with streams():
        assert claim_group("audit", state=state).size == 0  # no claim during the pause
        assert stream_status("audit").paused_until == state.paused_until
    assert OutboxEvent.objects.filter(group_id__isnull=True).count() == 4


def test_after_the_pause_the_stream_resumes_with_the_same_attempt(handler_mode):
    handler_mode("retry-after")
    runner = InlineRunner()
    with streams(), runner.capturing():
        publish_many("audit", [{"n": n} for n in range(6)])
    runner.drain()
    handler_mode("ok")
    pass_the_pause("audit")
    with streams():
        runner.distribute("audit")

    assert ArchivedEvent.objects.filter(stream="audit").count() == 6
    assert not OutboxGroup.objects.exists()
    assert sorted(HandledCall.objects.values_list("attempt", flat=True)) == [1, 1, 1, 1]
    assert StreamState.objects.get(stream="audit").paused_until is None  # cleared


def test_retry_after_holds_the_queued_groups_too(handler_mode):
    runner = InlineRunner()
    publish_unwoken("audit", [{"n": n} for n in range(4)])
    with streams():
        with runner.capturing():
            queued = [claim_group("audit") for _ in range(2)]  # their jobs wait in the queue
        assert [claim.size for claim in queued] == [2, 2]
        handler_mode("retry-after")
        runner.drain()
    # The first job to call was paused; the other found its group held for the pause.
    assert HandledCall.objects.count() == 1
    assert set(OutboxGroup.objects.values_list("state", flat=True)) == {GroupState.RETRYING}
    until = StreamState.objects.get(stream="audit").paused_until
    assert set(OutboxGroup.objects.values_list("next_attempt_at", flat=True)) == {until}


def test_retry_after_inside_a_transactional_handler_rolls_back_and_pauses(handler_mode):
    handler_mode("retry-after")
    runner = InlineRunner()
    with streams(audit={**AUDIT, "TRANSACTIONAL": True}), runner.capturing():
        publish("audit", {"n": 1})
    with streams(audit={**AUDIT, "TRANSACTIONAL": True}):
        runner.drain()
    assert not HandledCall.objects.exists()  # its write rolled back with the attempt
    group = OutboxGroup.objects.get()
    assert (group.state, group.attempt) == (GroupState.RETRYING, 0)


def test_retry_after_takes_a_positive_number_of_seconds():
    for bad in (0, -1, float("nan"), True, "5", 10**6):
        with pytest.raises(ValueError, match="RetryAfter takes"):
            RetryAfter(bad)
    assert RetryAfter(2.5).seconds == 2.5


# -- the budget -------------------------------------------------------------------


def test_a_budget_must_be_a_positive_number():
    for bad in (0, -2, "10", True):
        with streams(paced={**PACED, "CALLS_PER_SECOND": bad}):
            found = [m for m in run_checks() if m.id == "django_outbox.E060"]
        assert [m.msg for m in found] == [
            f"DJANGO_OUTBOX['STREAMS']['paced']['CALLS_PER_SECOND'] must be a positive "
            f"number or None, not {bad!r}."
        ]
        assert found[0].hint.startswith("Remove it for no budget")
    with streams(paced={**PACED, "CALLS_PER_SECOND": 0.5}):
        assert not [m for m in run_checks() if m.id == "django_outbox.E060"]


def call_times(stream: str = "paced") -> list[float]:
    values = JobEffect.objects.filter(label=f"call:{stream}").values_list("value", flat=True)
    return sorted(value["at"] for value in values)


def assert_within_budget(times: list[float], start: float, per_second: float) -> None:
    """The k-th call started no earlier than k - 1 intervals after *start*: at most
    ``per_second`` calls in every second from the start (a late call cannot break it)."""
    interval = 1 / per_second
    early = [
        (k, round(at - start, 3))
        for k, at in enumerate(times)
        if at - start < k * interval - 0.002  # the database's clock, to the millisecond
    ]
    assert not early, f"calls ahead of the budget (k, seconds from the start): {early[:5]}"


def test_a_stream_with_a_budget_paces_its_calls_in_one_run():
    publish_unwoken("paced", [{"n": n} for n in range(8)])
    with streams(paced={**PACED, "RUNS": 1}):  # one run does it all
        start = database_now().timestamp()
        outcomes = run_stream("paced")
    assert outcomes == [AttemptOutcome.DONE] * 8
    times = call_times()
    assert len(times) == 8
    assert_within_budget(times, start, PACED["CALLS_PER_SECOND"])
    assert StreamState.objects.get(stream="paced").budget_calls == 8


def test_a_stream_ahead_of_its_budget_hands_its_group_back():
    publish_unwoken("paced", [{"n": n} for n in range(2)])
    StreamState.objects.create(stream="paced")
    with streams(paced=PACED):
        StreamState.objects.filter(stream="paced").update(
            next_call_at=Now() + timedelta(seconds=30)
        )
        group = claim_group("paced", run_here=False)
        assert group.size == 0  # ahead of the budget: nothing is claimed
        StreamState.objects.filter(stream="paced").update(next_call_at=Now())
        runner = InlineRunner()
        with runner.capturing():
            group = claim_group("paced")  # queued, its job waits
        StreamState.objects.filter(stream="paced").update(
            next_call_at=Now() + timedelta(seconds=30)
        )
        assert [job.run() for job in runner.jobs] == [[AttemptOutcome.DEFERRED]]
    deferred = OutboxGroup.objects.get()
    assert (deferred.state, deferred.attempt) == (GroupState.RETRYING, 0)
    assert deferred.next_attempt_at == StreamState.objects.get(stream="paced").next_call_at
    assert not JobEffect.objects.exists()


ROWED = {
    "HANDLER": "tests.testapp.handlers.record_call_time",
    "ROWS_PER_SECOND": 10,
    "LEASE_SECONDS": 120,
}


def test_a_row_budget_must_be_a_positive_number():
    for bad in (0, -2, "10", True):
        with streams(paced={**ROWED, "ROWS_PER_SECOND": bad}):
            found = [m for m in run_checks() if m.id == "django_outbox.E061"]
        assert [m.msg for m in found] == [
            f"DJANGO_OUTBOX['STREAMS']['paced']['ROWS_PER_SECOND'] must be a positive "
            f"number or None, not {bad!r}."
        ]
        assert found[0].hint.startswith("Remove it for no row budget")
    with streams(paced={**ROWED, "ROWS_PER_SECOND": 0.5}):
        assert not [m for m in run_checks() if m.id == "django_outbox.E061"]


def calls_with_rows(stream: str = "paced") -> list[tuple[float, int]]:
    values = JobEffect.objects.filter(label=f"call:{stream}").values_list("value", flat=True)
    return sorted((value["at"], len(value["ids"])) for value in values)


def assert_within_row_budget(calls: list[tuple[float, int]], start: float, rows: float) -> None:
    """Each call started no earlier than the rows of the calls before it allow, at
    *rows* a second from *start* (a late call cannot break it)."""
    sent = 0
    early = []
    for at, size in calls:
        if at - start < sent / rows - 0.002:  # the database's clock, to the millisecond
            early.append((sent, round(at - start, 3)))
        sent += size
    assert not early, f"calls ahead of the row budget (rows before, seconds): {early[:5]}"


def test_a_row_budget_paces_calls_by_their_rows_and_caps_the_claim():
    publish_unwoken("paced", [{"n": n} for n in range(25)])
    with streams(paced={**ROWED, "BATCH_SIZE": 1000, "RUNS": 1}):
        assert stream_status("paced").batch_size == 10  # one second's rows
        start = database_now().timestamp()
        outcomes = run_stream("paced")
    assert outcomes == [AttemptOutcome.DONE] * 3
    calls = calls_with_rows()
    assert [size for _, size in calls] == [10, 10, 5]  # no call carries more than a second
    assert_within_row_budget(calls, start, ROWED["ROWS_PER_SECOND"])
    state = StreamState.objects.get(stream="paced")
    assert (state.budget_calls, state.budget_rows) == (3, 25)


def test_small_groups_share_the_row_budget_by_their_weight():
    publish_unwoken("paced", [{"n": n} for n in range(12)])
    with streams(paced={**ROWED, "BATCH_SIZE": 4, "RUNS": 1}):
        start = database_now().timestamp()
        run_stream("paced")
    calls = calls_with_rows()
    assert [size for _, size in calls] == [4, 4, 4]
    assert_within_row_budget(calls, start, ROWED["ROWS_PER_SECOND"])  # 0.4 s per group


def test_a_group_larger_than_a_second_of_rows_goes_and_the_next_call_waits_for_it():
    publish_unwoken("paced", [{"n": n} for n in range(30)])
    runner = InlineRunner()
    unbudgeted = {"HANDLER": ROWED["HANDLER"], "BATCH_SIZE": 30}
    with streams(paced=unbudgeted), runner.capturing():
        assert claim_group("paced").size == 30  # claimed before the budget was set
    with streams(paced=ROWED):
        start = database_now().timestamp()
        assert [job.run() for job in runner.jobs] == [[AttemptOutcome.DONE]]  # not held back
        state = StreamState.objects.get(stream="paced")
        assert state.next_call_at.timestamp() - start >= 3.0  # its whole weight: 30 / 10
        assert state.budget_rows == 30
        publish_unwoken("paced", [{"n": 30}])
        assert claim_group("paced", run_here=False).size == 0  # the next one waits
    assert [size for _, size in calls_with_rows()] == [30]


@pytest.mark.postgres
def test_two_processes_share_one_budget(tmp_path):
    """Two processes run the stream at once; their calls together stay in the budget."""
    if connection.vendor != "postgresql":
        pytest.skip("concurrent workers: PostgreSQL")
    publish_unwoken("paced", [{"n": n} for n in range(30)])
    start_file = tmp_path / "start"
    code = (
        "from tests.procs import run_stream_until_empty; "
        f"run_stream_until_empty('paced', {str(start_file)!r})"
    )
    env = {"OUTBOX_TEST_PACED": "1"}
    with (
        running(["-c", code], "paced-a", OUTBOX_TEST_CLUSTER_LABEL="a", **env) as a,
        running(["-c", code], "paced-b", OUTBOX_TEST_CLUSTER_LABEL="b", **env) as b,
    ):
        wait_until(lambda: all("ready" in log(p) for p in (a, b)), 60, watch=[a, b])
        start = database_now().timestamp()
        start_file.write_text("go")
        assert a.wait(120) == 0 and b.wait(120) == 0, (log(a), log(b))
    times = call_times()
    assert len(times) == 30
    assert_within_budget(times, start, PACED["CALLS_PER_SECOND"])
    assert ArchivedEvent.objects.filter(stream="paced").count() == 30
    by_process = {value["cluster"] for value in JobEffect.objects.values_list("value", flat=True)}
    assert by_process == {"a", "b"}  # both took part


@pytest.mark.postgres
def test_two_processes_share_one_row_budget(tmp_path):
    """Two processes run a stream with ROWS_PER_SECOND at once; their calls together
    stay within its rows."""
    if connection.vendor != "postgresql":
        pytest.skip("concurrent workers: PostgreSQL")
    rowed = settings.ROWED_STREAM
    publish_unwoken("rowed", [{"n": n} for n in range(40)])
    start_file = tmp_path / "start"
    code = (
        "from tests.procs import run_stream_until_empty; "
        f"run_stream_until_empty('rowed', {str(start_file)!r})"
    )
    env = {"OUTBOX_TEST_ROWED": "1"}
    with (
        running(["-c", code], "rowed-a", OUTBOX_TEST_CLUSTER_LABEL="a", **env) as a,
        running(["-c", code], "rowed-b", OUTBOX_TEST_CLUSTER_LABEL="b", **env) as b,
    ):
        wait_until(lambda: all("ready" in log(p) for p in (a, b)), 60, watch=[a, b])
        start = database_now().timestamp()
        start_file.write_text("go")
        assert a.wait(120) == 0 and b.wait(120) == 0, (log(a), log(b))
    calls = calls_with_rows("rowed")
    assert sum(size for _, size in calls) == 40
    assert all(size <= rowed["BATCH_SIZE"] for _, size in calls)
    assert_within_row_budget(calls, start, rowed["ROWS_PER_SECOND"])
    by_process = {value["cluster"] for value in JobEffect.objects.values_list("value", flat=True)}
    assert by_process == {"a", "b"}  # both took part
    assert StreamState.objects.get(stream="rowed").budget_rows == 40


def log(process) -> str:
    return process.log_path.read_text()


# -- what an operator sees ----------------------------------------------------------


def test_the_pause_and_the_budget_show_in_status_metrics_and_admin(handler_mode, admin_client):
    handler_mode("retry-after")
    runner = InlineRunner()
    with streams(paced=PACED), runner.capturing():
        publish("audit", {"n": 1})
    with streams(paced=PACED):
        runner.drain()
        StreamState.objects.get_or_create(stream="paced")
        StreamState.objects.filter(stream="paced").update(budget_calls=42)
        out = StringIO()
        call_command("outbox_status", stdout=out)
        text = out.getvalue()
        assert "audit is paused for 30s more" in text or "audit is paused for 29s more" in text
        assert "paced has a rate budget of 10 handler calls/s (42 calls made under it)" in text
        from django_outbox.metrics import render

        body = render()[0].decode()
        assert 'django_outbox_calls_per_second_budget{stream="paced"} 10.0' in body
        assert 'django_outbox_budget_calls_total{stream="paced"} 42.0' in body
        assert 'django_outbox_stream_pause_seconds{stream="audit"} 29.' in body
        page = admin_client.get(reverse("admin:django_outbox_streamstate_changelist"))
        assert page.status_code == 200
        assert "Calls/s budget" in page.content.decode()
        detail = admin_client.get(
            reverse("admin:django_outbox_streamstate_change", args=["audit"])
        ).content.decode()
        assert "Paused until" in detail and "Next call at" in detail


def test_the_row_budget_shows_in_status_metrics_and_admin(admin_client):
    with streams(paced=ROWED):
        StreamState.objects.get_or_create(stream="paced")
        StreamState.objects.filter(stream="paced").update(budget_rows=420)
        out = StringIO()
        call_command("outbox_status", stdout=out)
        assert "paced has a row budget of 10 rows/s (420 rows handed over under it)" in (
            out.getvalue()
        )
        from django_outbox.metrics import render

        body = render()[0].decode()
        assert 'django_outbox_rows_per_second_budget{stream="paced"} 10.0' in body
        assert 'django_outbox_budget_rows_total{stream="paced"} 420.0' in body
        page = admin_client.get(reverse("admin:django_outbox_streamstate_changelist"))
        assert "Rows/s budget" in page.content.decode()
        detail = admin_client.get(
            reverse("admin:django_outbox_streamstate_change", args=["paced"])
        ).content.decode()
        assert "Budget rows" in detail


@pytest.mark.process
def test_two_clusters_keep_one_budget(tmp_path):
    """Two real qclusters (2 workers each) share the stream's 10 calls a second."""
    env = {"OUTBOX_TEST_PACED": "1"}
    with (
        qcluster("paced-a", log=tmp_path / "a.log", OUTBOX_TEST_CLUSTER_LABEL="a", **env) as a,
        qcluster("paced-b", log=tmp_path / "b.log", OUTBOX_TEST_CLUSTER_LABEL="b", **env) as b,
        streams(paced=PACED),
    ):
        # Both clusters take jobs before the clock starts: a slow start gives no slack.
        wait_until(lambda: all(" running." in log(p) for p in (a, b)), 60, watch=[a, b])
        start = database_now().timestamp()
        # Which cluster takes a run is the broker's choice: rounds of 50 events until
        # both clusters have made calls (the budget is judged over all of them).
        for sent in range(50, 201, 50):
            for n in range(sent - 50, sent, 5):
                publish_many("paced", [{"n": n + i} for i in range(5)])  # each commit wakes

            def delivered(sent: int = sent) -> bool:
                distribute_stream("paced")  # plays the schedule: groups handed back are due again
                return ArchivedEvent.objects.filter(stream="paced").count() >= sent

            wait_until(
                delivered,
                timeout=120,
                interval=0.5,
                describe=lambda: stream_status("paced"),
                watch=[a, b],
                check=fail_on_queue_failures,
            )
            values = JobEffect.objects.filter(label="call:paced").values_list("value", flat=True)
            clusters = {value["cluster"] for value in values}
            if clusters == {"a", "b"}:
                break
    assert log_problems(a) == [] and log_problems(b) == []
    times = call_times()
    assert len(times) == sent
    assert_within_budget(times, start, PACED["CALLS_PER_SECOND"])
    assert clusters == {"a", "b"}, clusters  # both clusters made calls


def test_the_guides_handler_pauses_its_stream_on_a_429():
    from tests.docs_examples import rate_limits

    rate_limits.crm.answers[:] = [429]
    rate_limits.crm.bodies.clear()
    crm_stream = {"HANDLER": "tests.docs_examples.rate_limits.sync_contacts", "BATCH_SIZE": 5}
    runner = InlineRunner()
    with streams(crm=crm_stream), runner.capturing():
        publish_many("crm", [{"email": f"{n}@example.com"} for n in range(5)])
    with streams(crm=crm_stream):
        runner.drain()
        assert len(rate_limits.crm.bodies) == 1
        group = OutboxGroup.objects.get(stream="crm")
        assert (group.state, group.attempt) == (GroupState.RETRYING, 0)
        assert stream_status("crm").pause_seconds > 19
        pass_the_pause("crm")
        runner.distribute("crm")  # the answer is 200 now
    assert ArchivedEvent.objects.filter(stream="crm").count() == 5
    assert len(rate_limits.crm.bodies) == 2


# -- a pause holds every run of the stream ---------------------------------------------


class Race:
    """Two runs of one stream in two threads: run A's first handler call asks for a
    pause while run B holds a group. Every call is recorded with whether the stream's
    pause had been seen committed when the call started."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[tuple[str, list[int], str]] = []
        self.phase = "before"  # "paused" once the pause has committed, then "over"
        self.a_calling = threading.Event()
        self.b_calling = threading.Event()
        self.paused = threading.Event()  # set once the pause has committed
        self.errors: list[BaseException] = []

    def call(self, batch, *, first_asks: str) -> None:
        """The handler: the first call (run A's) waits for *first_asks*, then pauses."""
        ids = list(batch.ids)
        with self.lock:
            role = "A" if not self.calls else "B" if len(self.calls) == 1 else "later"
            self.calls.append((role, ids, self.phase))
        if role == "A":
            self.a_calling.set()
            if first_asks == "b-calling":
                assert self.b_calling.wait(30), "run B never called"
            else:
                assert self.b_reserved(), "run B never took its slot"
            raise RetryAfter(30, "429 Too Many Requests")
        if role == "B":
            self.b_calling.set()
            assert self.paused.wait(30), "run A's pause never committed"

    def b_reserved(self) -> bool:
        """Run B took the stream's second call slot (and waits for it)."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if StreamState.objects.filter(stream="paced", budget_calls__gte=2).exists():
                return True
            time.sleep(0.01)
        return False

    def thread(self, target) -> threading.Thread:
        def body() -> None:
            try:
                with handoff.capture():
                    target()
            except BaseException as exc:  # reported by the test
                self.errors.append(exc)
            finally:
                connections.close_all()

        started = threading.Thread(target=body)
        started.start()
        return started

    def pause_committed(self) -> None:
        self.phase = "paused"
        self.paused.set()

    def calls_in(self, phase: str) -> list[list[int]]:
        return [ids for _, ids, when in self.calls if when == phase]


race: Race | None = None


def race_handler(batch) -> None:
    assert race is not None
    race.call(batch, first_asks="b-calling")


def race_paced_handler(batch) -> None:
    assert race is not None
    race.call(batch, first_asks="b-reserved")


def await_pause(stream: str) -> None:
    wait_until(
        lambda: StreamState.objects.filter(stream=stream, paused_until__gt=Now()).exists(), 30
    )


@pytest.fixture
def two_runs():
    global race
    race = Race()
    yield race
    race = None


def test_a_pause_stops_a_second_run_that_goes_on_with_its_state_read_before_it(
    two_runs, monkeypatch
):
    """Run B's handler call started before run A's pause (it finishes); B then goes on
    with the stream state it read before the pause: it claims nothing, and no run, no
    reservation, no distribute starts during the pause. After it, every row goes."""
    import django_outbox.streams.run

    monkeypatch.setattr(django_outbox.streams.run, "RECHECK_SECONDS", 3600.0)  # B keeps its state
    raced = {**AUDIT, "HANDLER": "tests.streams.test_budget.race_handler"}
    ids = publish_unwoken("audit", [{"n": n} for n in range(6)])
    with streams(audit=raced):
        a = two_runs.thread(lambda: run_stream("audit"))
        assert two_runs.a_calling.wait(30)
        b = two_runs.thread(lambda: run_stream("audit"))
        await_pause("audit")
        two_runs.pause_committed()
        for thread in (a, b):
            thread.join(60)
        assert not two_runs.errors, two_runs.errors
        assert not a.is_alive() and not b.is_alive()
        assert two_runs.calls_in("paused") == []  # B's next claim took nothing
        with handoff.capture() as queue:
            assert start_runs("audit", 2, reserve=True) == 0  # a fan-out starts nothing
            assert start_runs("audit", 1) == 0
            assert distribute_stream("audit").runs_started == 0
        assert not queue
        assert OutboxEvent.objects.filter(stream="audit", group_id__isnull=True).count() == 2

        pass_the_pause("audit")
        two_runs.phase = "over"
        InlineRunner().distribute("audit")
    assert sorted(two_runs.calls_in("over")) == [ids[0:2], ids[4:6]]
    assert ArchivedEvent.objects.filter(stream="audit").count() == 6


def test_a_run_waiting_for_its_slot_when_the_stream_pauses_hands_its_group_back(
    two_runs, monkeypatch
):
    """Run B holds a claimed group and waits for its call slot when run A's handler
    asks for a pause: B does not call the handler; its group goes back to the queue,
    attempt unchanged, due when the pause ends, and is delivered after it."""
    monkeypatch.setattr(budget, "WAIT_SECONDS", 10.0)  # B waits out a 4 s slot
    raced = {**PACED, "HANDLER": "tests.streams.test_budget.race_paced_handler"}
    raced.update(CALLS_PER_SECOND=0.25, CHAINS=2)
    ids = publish_unwoken("paced", [{"n": n} for n in range(2)])
    with streams(paced=raced):
        a = two_runs.thread(lambda: run_stream("paced"))
        assert two_runs.a_calling.wait(30)
        outcomes: list[AttemptOutcome] = []
        b = two_runs.thread(lambda: outcomes.extend(run_stream("paced")))
        await_pause("paced")
        two_runs.pause_committed()
        for thread in (a, b):
            thread.join(60)
        assert not two_runs.errors, two_runs.errors
        assert outcomes == [AttemptOutcome.DEFERRED]
        assert [role for role, _, _ in two_runs.calls] == ["A"]  # B called nothing
        until = StreamState.objects.get(stream="paced").paused_until
        groups = OutboxGroup.objects.filter(stream="paced", size__gt=0)  # A's, B's
        assert {(g.state, g.attempt, g.next_attempt_at) for g in groups} == {
            (GroupState.RETRYING, 0, until)
        }
        assert groups.count() == 2

        pass_the_pause("paced")
        two_runs.phase = "over"
        InlineRunner().distribute("paced")
    assert sorted(two_runs.calls_in("over")) == [[ids[0]], [ids[1]]]
    assert ArchivedEvent.objects.filter(stream="paced").count() == 2


def test_a_queued_group_taken_during_a_pause_goes_back_and_no_run_starts():
    """A group queued for a job when the stream's pause is already set (rescued, split,
    or queued by a claim that read the state before the pause) is not handed to the
    handler: its job takes nothing and the group waits for the pause, attempt unchanged.
    No fan-out, run or distribute starts anything meanwhile."""
    publish_unwoken("audit", [{"n": n} for n in range(4)])
    runner = InlineRunner()
    with streams():
        with runner.capturing():
            queued = claim_group("audit")  # its job waits in the queue
        StreamState.objects.filter(stream="audit").update(
            paused_until=Now() + timedelta(seconds=30)
        )
        with handoff.capture() as started:
            assert start_runs("audit", 2, reserve=True) == 0
            assert start_runs("audit", 1) == 0
            assert distribute_stream("audit").runs_started == 0
        assert not started
        assert [job.run() for job in runner.jobs] == [[]]
        assert not HandledCall.objects.exists()
        group = OutboxGroup.objects.get(id=queued.group_id)
        until = StreamState.objects.get(stream="audit").paused_until
        assert (group.state, group.attempt, group.next_attempt_at) == (
            GroupState.RETRYING,
            0,
            until,
        )
        pass_the_pause("audit")
        runner.distribute("audit")
    assert ArchivedEvent.objects.filter(stream="audit").count() == 4
    assert sorted(HandledCall.objects.values_list("attempt", flat=True)) == [1, 1]

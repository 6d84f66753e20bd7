"""Staged jobs: stage_task() in the caller's transaction, drained into django-q2."""

from __future__ import annotations

import contextlib
import functools
import io
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from unittest import mock

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.db import transaction
from django.test import override_settings
from django.utils import timezone
from django.utils.translation import gettext_lazy
from django_q.models import OrmQ
from django_q.signing import SignedPackage

from django_outbox.conf import outbox_settings
from django_outbox.exceptions import StagingError
from django_outbox.jobs import staging
from django_outbox.jobs.staging import drain, drain_until_empty, stage_task
from django_outbox.models import StagedJob
from django_outbox.signals import staged_jobs_forwarded
from django_outbox.streams.status import staged_counts
from django_outbox.transport import handoff
from tests.testapp import jobs
from tests.testapp.models import JobEffect

pytestmark = pytest.mark.django_db(transaction=True)

RECORD = "tests.testapp.jobs.record"


class Boom(Exception):
    pass


def queued() -> list[dict]:
    """The django-q2 tasks in the ORM broker's queue, oldest first."""
    return [SignedPackage.loads(row.payload) for row in OrmQ.objects.order_by("id")]


def without_forward_on_commit():
    outbox = dict(settings.DJANGO_OUTBOX)
    outbox["STAGING"] = {**outbox["STAGING"], "FORWARD_ON_COMMIT": False}
    return override_settings(DJANGO_OUTBOX=outbox)


def test_a_job_staged_in_a_rolled_back_transaction_is_never_enqueued():
    with pytest.raises(Boom), transaction.atomic():
        stage_task(RECORD, "never")
        raise Boom

    assert drain().forwarded == 0
    assert StagedJob.objects.count() == 0
    assert OrmQ.objects.count() == 0


def test_with_the_orm_broker_a_job_due_now_goes_into_its_queue_inside_the_transaction(
    django_assert_max_num_queries,
):
    with transaction.atomic():
        with django_assert_max_num_queries(1):  # one INSERT, as async_task would cost
            assert stage_task(RECORD, "paid", {"order": 7}) is None
        assert StagedJob.objects.count() == 0

    [task] = queued()
    assert (task["func"], task["args"], task["kwargs"]) == (RECORD, ("paid", {"order": 7}), {})
    assert drain().forwarded == 0  # nothing left for the drainer to send twice


def test_the_jobs_of_one_transaction_reach_the_queue_in_order():
    with transaction.atomic():
        for n in range(20):
            stage_task(RECORD, f"job-{n}")

    assert [task["args"][0] for task in queued()] == [f"job-{n}" for n in range(20)]
    assert StagedJob.objects.count() == 0


def test_without_forward_on_commit_the_drainer_forwards_in_id_order_in_bulk(
    django_assert_max_num_queries,
):
    with without_forward_on_commit():
        for n in range(50):
            stage_task(RECORD, f"job-{n}")
        assert StagedJob.objects.count() == 50

        # BEGIN, DELETE ... RETURNING, one bulk INSERT into the queue, COMMIT
        with django_assert_max_num_queries(4):
            result = drain(limit=100)

    assert (result.forwarded, result.kept) == (50, 0)
    assert [task["args"][0] for task in queued()] == [f"job-{n}" for n in range(50)]
    assert StagedJob.objects.count() == 0


def test_drain_takes_at_most_one_batch_and_drain_until_empty_takes_all():
    with without_forward_on_commit():
        for n in range(25):
            stage_task(RECORD, f"job-{n}")

        assert drain(limit=10).forwarded == 10
        report = drain_until_empty(limit=10)

    assert (report.forwarded, report.batches, report.empty) == (15, 2, True)
    assert len(queued()) == 25


def test_a_delayed_job_waits_until_it_is_due():
    staged_id = stage_task(RECORD, "later", run_after=timedelta(hours=1))

    assert drain().forwarded == 0
    assert StagedJob.objects.filter(pk=staged_id).exists()

    StagedJob.objects.filter(pk=staged_id).update(run_after=timezone.now() - timedelta(seconds=1))
    assert drain().forwarded == 1
    assert [task["args"] for task in queued()] == [("later",)]


def test_q_options_reach_django_q2_and_keyword_arguments_reach_the_task():
    stage_task(
        "tests.testapp.jobs.record_kwargs",
        "opts",
        colour="blue",
        q_options={"timeout": 30, "group": "billing", "task_name": "nightly-bill", "save": False},
    )

    [task] = queued()
    assert task["kwargs"] == {"colour": "blue"}
    assert (task["timeout"], task["group"], task["name"], task["save"]) == (
        30,
        "billing",
        "nightly-bill",
        False,
    )


def test_a_staged_cluster_is_the_broker_queue_of_the_job():
    alt = {**settings.Q_CLUSTER, "ALT_CLUSTERS": {"slow": {}}}
    with override_settings(Q_CLUSTER=alt):
        stage_task(RECORD, "slow", q_options={"cluster": "slow"})

    assert list(OrmQ.objects.values_list("key", flat=True)) == ["slow"]


def test_stage_task_accepts_the_function_itself():
    stage_task(jobs.record, "by-reference")

    assert [task["func"] for task in queued()] == [RECORD]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: stage_task("os.system", "rm -rf /"), "'os.system' is not in an allowed module"),
        (lambda: stage_task("tests.testapp.jobs.missing"), "Cannot import the staged task"),
        (lambda: stage_task("tests.testapp.jobs.NOT_CALLABLE"), "is not callable"),
        (lambda: stage_task(RECORD, object()), "The arguments of a staged job must be JSON"),
        (lambda: stage_task(RECORD, float("nan")), "must be JSON"),
        (lambda: stage_task(RECORD, "x", when=timezone), "keyword arguments of a staged job"),
        (lambda: stage_task(RECORD, q_options={"retry": 5}), "Unknown django-q2 options"),
        (lambda: stage_task(RECORD, run_after="soon"), "run_after must be an aware datetime"),
        (lambda: stage_task(RECORD, idempotency_key=7), "idempotency_key must be a string"),
        (lambda: stage_task(""), "needs a function or its dotted path"),
        # a function imported into an allowed module is still the other module's function
        (lambda: stage_task("tests.testapp.jobs.import_string"), "defined outside the allowed"),
        (lambda: stage_task(functools.partial(jobs.record, "x")), "plain module-level function"),
        (lambda: stage_task("tests.testapp.jobs.partial_record"), "not a plain function"),
        (lambda: stage_task(RECORD, q_options={"hook": "os.system"}), "'os.system' is not in"),
        (lambda: stage_task(RECORD, q_options={"chain": [("os.system", "x")]}), "Unknown"),
        # django-q2 hands the timeout to signal.alarm: whole seconds, and 0 means none
        (lambda: stage_task(RECORD, q_options={"timeout": "1"}), "'timeout'] must be a positive"),
        (lambda: stage_task(RECORD, q_options={"timeout": 2.5}), "'timeout'] must be a positive"),
        (lambda: stage_task(RECORD, q_options={"timeout": 0}), "'timeout'] must be a positive"),
        (lambda: stage_task(RECORD, q_options={"timeout": -3}), "'timeout'] must be a positive"),
        (lambda: stage_task(RECORD, q_options={"timeout": True}), "'timeout'] must be a positive"),
        (lambda: stage_task(RECORD, q_options=["hook"]), "q_options must be a dict"),
        (lambda: stage_task(RECORD, idempotency_key="staged:4"), "the drainer's own keys"),
    ],
)
def test_bad_input_fails_at_stage_task_and_stages_nothing(call, message):
    with pytest.raises(StagingError, match=message):
        call()

    assert StagedJob.objects.count() == 0
    assert OrmQ.objects.count() == 0


def test_a_module_is_allowed_by_prefix_not_by_name_start():
    outbox = settings.DJANGO_OUTBOX
    narrow = {**outbox, "STAGING": {"ALLOWED_MODULES": ["tests.test"]}}
    with override_settings(DJANGO_OUTBOX=narrow), pytest.raises(StagingError):
        stage_task(RECORD, "tests.testapp is not under tests.test")


def test_a_row_that_can_no_longer_run_is_kept_with_its_error_and_skipped_later():
    with without_forward_on_commit():
        bad = stage_task(RECORD, "bad")
        good = stage_task(RECORD, "good")
        StagedJob.objects.filter(pk=bad).update(func="tests.testapp.jobs.gone")

        result = drain()

    assert (result.forwarded, result.kept) == (1, 1)
    assert [task["args"] for task in queued()] == [("good",)]
    kept = StagedJob.objects.get()
    assert (kept.pk, kept.func, kept.args) == (bad, "tests.testapp.jobs.gone", ["bad"])
    assert "Cannot import the staged task" in kept.last_error
    assert not StagedJob.objects.filter(pk=good).exists()
    assert drain().forwarded + drain().kept == 0  # skipped until an operator fixes it


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"args": {"not": "a list"}}, "must be a JSON list"),
        ({"args": 7}, "must be a JSON list"),
        ({"kwargs": ["x"]}, "must be a JSON object"),
        ({"q_options": {"hook": "os.system"}}, "'os.system' is not in an allowed module"),
        ({"q_options": {"chain": [["os.system", ["id"]]]}}, "options for a staged job: chain"),
        ({"q_options": {"save": "yes"}}, "'save'] must be bool"),
        ({"q_options": {"timeout": 2.5}}, "'timeout'] must be a positive int"),
        ({"func": "tests.testapp.jobs.import_string"}, "defined outside the allowed modules"),
    ],
)
def test_a_row_written_behind_stage_tasks_back_is_checked_again_and_kept(change, message):
    with without_forward_on_commit():
        bad = stage_task(RECORD, "bad")
        stage_task(RECORD, "good")
        StagedJob.objects.filter(pk=bad).update(**change)

        result = drain()

    assert (result.forwarded, result.kept) == (1, 1)
    assert [task["func"] for task in queued()] == [RECORD]
    kept = StagedJob.objects.get()
    assert kept.pk == bad
    assert message in kept.last_error
    assert {name: getattr(kept, name) for name in change} == change  # kept as it was


def test_forwarding_sends_a_signal_with_the_count():
    seen = []

    def receiver(sender, count, duration, **kwargs):
        seen.append((sender, count, duration >= 0))

    staged_jobs_forwarded.connect(receiver)
    try:
        with without_forward_on_commit():
            stage_task(RECORD, "a")
            stage_task(RECORD, "b")
            drain()
    finally:
        staged_jobs_forwarded.disconnect(receiver)

    assert seen == [("django_outbox.staged", 2, True)]


def test_drained_jobs_run_inline_under_capture():
    with without_forward_on_commit():
        stage_task(RECORD, "inline", 1)
        with handoff.capture() as captured:
            drain()
        for job in captured:
            job.run()

    assert list(JobEffect.objects.values_list("label", "value")) == [("inline", 1)]


def test_a_keyed_job_runs_through_the_guard_and_its_effect_happens_once():
    stage_task(RECORD, "charge", 42, idempotency_key="charge:42")

    [task] = queued()
    assert task["func"] == staging.RUNNER
    scope = f"django_outbox.staged:{RECORD}"  # a caller's key is scoped by its function
    assert task["args"] == ("charge:42", RECORD, ["charge", 42], {}, scope)
    for _delivery in range(3):
        handoff.Job(task["func"], task["args"]).run()

    assert list(JobEffect.objects.values_list("label", "value")) == [("charge", 42)]


def test_a_job_whose_guarded_run_fails_runs_again_on_the_next_delivery():
    stage_task("tests.testapp.jobs.fail_first", "retry", idempotency_key="retry:1")
    [task] = queued()

    with pytest.raises(jobs.FirstDeliveryFails):
        handoff.Job(task["func"], task["args"]).run()
    handoff.Job(task["func"], task["args"]).run()
    handoff.Job(task["func"], task["args"]).run()

    assert list(JobEffect.objects.values_list("label", flat=True)) == ["retry"]


def test_a_callers_key_never_meets_another_functions_key_or_the_drainers_own(monkeypatch):
    # A broker outside the transaction (Redis…): every drained job runs behind a guard.
    monkeypatch.setattr(handoff, "in_transaction_hand_off", lambda alias=None: False)
    with without_forward_on_commit():
        unkeyed = stage_task(RECORD, "unkeyed")
        stage_task(RECORD, "a", idempotency_key="same")
        stage_task("tests.testapp.jobs.record_kwargs", "b", idempotency_key="same")
        with handoff.capture() as captured:
            drain()
        keys = [(job.args[0], job.args[4]) for job in captured]
        for job in list(captured) * 2:  # every job delivered twice
            job.run()

    assert keys == [
        (f"staged:{unkeyed}", "django_outbox.staged"),
        ("same", f"django_outbox.staged:{RECORD}"),
        ("same", "django_outbox.staged:tests.testapp.jobs.record_kwargs"),
    ]

    assert sorted(JobEffect.objects.values_list("label", flat=True)) == ["a", "b", "unkeyed"]


# A broker that can lose jobs: the rows stay until their job has run -------------------


@pytest.fixture
def lossy_broker(monkeypatch):
    """A broker outside the transaction (Redis…): the drainer keeps rows until they ran."""
    monkeypatch.setattr(handoff, "in_transaction_hand_off", lambda alias=None: False)


def forward(**kwargs) -> list[handoff.Job]:
    with handoff.capture() as captured:
        drain(**kwargs)
    return list(captured)


def test_a_forwarded_row_stays_until_its_job_has_run(lossy_broker):
    with without_forward_on_commit():
        staged_id = stage_task(RECORD, "kept")
        [job] = forward()

    row = StagedJob.objects.get(id=staged_id)
    assert row.forwarded_at is not None and row.last_error == ""
    assert forward() == []  # handed over already: not again before REDELIVER_SECONDS
    job.run()
    assert not StagedJob.objects.exists()
    assert list(JobEffect.objects.values_list("label", flat=True)) == ["kept"]


def test_a_job_the_broker_lost_is_handed_over_again_and_its_effect_happens_once(lossy_broker):
    with without_forward_on_commit():
        stage_task(RECORD, "lost")
        stage_task(RECORD, "keyed", idempotency_key="order:7")
        lost = forward()  # these deliveries never run: the broker lost them
        redeliver = outbox_settings().staging.redeliver_seconds
        StagedJob.objects.update(forwarded_at=timezone.now() - timedelta(seconds=redeliver + 1))
        again = forward()

    assert [job.args for job in again] == [job.args for job in lost]
    for job in again + lost:  # the lost ones turn up after all: no second effect
        job.run()
    assert sorted(JobEffect.objects.values_list("label", flat=True)) == ["keyed", "lost"]
    assert not StagedJob.objects.exists()


def test_a_job_that_raises_deletes_its_kept_row(lossy_broker):
    with without_forward_on_commit():
        stage_task("tests.testapp.jobs.fail_first", "fails")
        [job] = forward()
    with pytest.raises(jobs.FirstDeliveryFails):
        job.run()
    assert not StagedJob.objects.exists()  # failed as a django-q2 task, not redelivered


def test_forward_now_hands_a_kept_row_over_again(lossy_broker, admin_client):
    with without_forward_on_commit():
        staged_id = stage_task(RECORD, "stuck")
        forward()
        with handoff.capture() as captured:
            admin_client.post(
                "/admin/django_outbox/stagedjob/",
                {"action": "forward_now", "_selected_action": [staged_id]},
            )
    assert len(captured) == 1
    assert StagedJob.objects.get(id=staged_id).forwarded_at is not None


def max_forwards(count: int):
    outbox = dict(settings.DJANGO_OUTBOX)
    outbox["STAGING"] = {**outbox["STAGING"], "FORWARD_ON_COMMIT": False, "MAX_FORWARDS": count}
    return override_settings(DJANGO_OUTBOX=outbox)


def lose_deliveries() -> None:
    """Make every forwarded row due again, as REDELIVER_SECONDS of waiting would."""
    redeliver = outbox_settings().staging.redeliver_seconds
    StagedJob.objects.filter(forwarded_at__isnull=False).update(
        forwarded_at=timezone.now() - timedelta(seconds=redeliver + 1)
    )


def test_a_job_lost_max_forwards_times_is_kept_with_an_error_until_forwarded_again(
    lossy_broker, admin_client
):
    with max_forwards(2):
        staged_id = stage_task(RECORD, "killer")
        other = stage_task(RECORD, "other")
        for count in (1, 2):  # every delivery is lost (or kills its worker)
            assert [job.args[-1] for job in forward()] == [staged_id, other][: 3 - count]
            assert StagedJob.objects.get(id=staged_id).forward_count == count
            lose_deliveries()
            if count == 1:
                forward(ids=[other])[0].run()  # the other job runs the second time

        with handoff.capture() as captured:
            result = drain()
        assert (result.forwarded, result.kept, list(captured)) == (0, 1, [])
        row = StagedJob.objects.get()
        assert (row.id, row.forward_count, row.forwarded_at is not None) == (staged_id, 2, True)
        assert row.last_error.startswith("Forwarded 2 times (STAGING['MAX_FORWARDS']) and never")
        assert staged_counts() == {"waiting": 0, "forwarded": 0, "kept": 1}
        lose_deliveries()
        assert forward() == []  # not forwarded again, not deleted: the operator decides
        out = io.StringIO()
        call_command("outbox_status", stdout=out)
        assert "1 staged job(s) kept with an error and not forwarded" in out.getvalue()

        with handoff.capture() as captured:
            admin_client.post(
                "/admin/django_outbox/stagedjob/",
                {"action": "forward_now", "_selected_action": [staged_id]},
            )
        row = StagedJob.objects.get()
        assert (row.forward_count, row.last_error) == (1, "")
        [job] = captured
        job.run()

    assert not StagedJob.objects.exists()
    assert sorted(JobEffect.objects.values_list("label", flat=True)) == ["killer", "other"]


def test_a_delivery_that_dies_mid_job_leaves_its_row_for_the_next_forward(lossy_broker):
    with max_forwards(3):
        stage_task(RECORD, "dies")
        [job] = forward()
        killed = mock.patch.object(JobEffect.objects, "create", side_effect=KeyboardInterrupt)
        with killed, pytest.raises(KeyboardInterrupt):
            job.run()  # nothing of it commits, as when its worker is killed
        lose_deliveries()
        [again] = forward()
        again.run()

    assert StagedJob.objects.count() == 0
    assert list(JobEffect.objects.values_list("label", flat=True)) == ["dies"]


@pytest.mark.postgres
def test_a_running_job_is_not_forwarded_again_and_a_second_delivery_returns_at_once(
    lossy_broker, admin_client
):
    import threading

    from django.db import connection

    jobs.STARTED.clear()
    jobs.RELEASED.clear()
    with max_forwards(5):
        staged_id = stage_task("tests.testapp.jobs.record_when_released", "long")
        [job] = forward()
        lose_deliveries()  # the job runs longer than REDELIVER_SECONDS

        def deliver():
            try:
                job.run()
            finally:
                connection.close()

        running = threading.Thread(target=deliver)
        running.start()
        try:
            assert jobs.STARTED.wait(30)
            assert forward() == []  # held by the running job: not forwarded again
            second = threading.Thread(target=deliver)
            second.start()
            second.join(30)
            assert not second.is_alive()  # no wait for the running job's locks
            response = admin_client.post(
                "/admin/django_outbox/stagedjob/",
                {"action": "forward_now", "_selected_action": [staged_id]},
                follow=True,
            )
            assert running.is_alive()  # the operator got an answer while the job runs
            assert "1 running now, left alone" in response.content.decode()
            assert StagedJob.objects.get(id=staged_id).forward_count == 1
        finally:
            jobs.RELEASED.set()
            running.join(60)

    assert not StagedJob.objects.exists()
    assert list(JobEffect.objects.values_list("label", flat=True)) == ["long"]


# outbox_drain ----------------------------------------------------------------------------


def test_outbox_drain_once_forwards_and_reports():
    with without_forward_on_commit():
        for n in range(3):
            stage_task(RECORD, f"job-{n}")
        out = io.StringIO()
        call_command("outbox_drain", "--once", stdout=out)

    assert out.getvalue() == "Forwarded 3 staged job(s).\n"
    assert len(queued()) == 3


@pytest.mark.parametrize(
    "args",
    [
        ["--batch-size", "0"],
        ["--batch-size", "many"],
        ["--max-sleep", "-1"],
        ["--min-sleep", "3", "--max-sleep", "1"],
    ],
)
def test_outbox_drain_rejects_bad_arguments_and_forwards_nothing(args):
    with without_forward_on_commit():
        stage_task(RECORD, "stays")
        with pytest.raises(CommandError):
            call_command("outbox_drain", "--once", *args, stdout=io.StringIO())

    assert StagedJob.objects.count() == 1
    assert OrmQ.objects.count() == 0


@pytest.mark.postgres
def test_two_concurrent_drainers_forward_every_job_exactly_once():
    import threading

    from django.db import connection

    with without_forward_on_commit():
        with transaction.atomic():
            for n in range(2000):
                stage_task(RECORD, f"job-{n}")
        start = threading.Barrier(2)
        errors: list[BaseException] = []

        def drainer():
            try:
                start.wait()
                drain_until_empty(limit=50)
            except BaseException as exc:  # reported below
                errors.append(exc)
            finally:
                connection.close()

        threads = [threading.Thread(target=drainer) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    assert errors == []
    labels = [task["args"][0] for task in queued()]
    assert sorted(labels) == sorted(f"job-{n}" for n in range(2000))
    assert StagedJob.objects.count() == 0


@pytest.mark.parametrize("forward_on_commit", [True, False], ids=["handed-off", "drained"])
def test_arguments_djangos_encoder_encodes_reach_the_task_as_its_strings(forward_on_commit):
    when = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    price = Decimal("9.50")
    with contextlib.ExitStack() as stack:
        if not forward_on_commit:
            stack.enter_context(without_forward_on_commit())
        with transaction.atomic():
            stage_task(RECORD, "typed", {"at": when, "price": price, "note": gettext_lazy("hi")})
            stage_task("tests.testapp.jobs.record_kwargs", "kw", at=when)
        with handoff.capture() as captured:
            drain()
            if forward_on_commit:
                captured.extend(
                    handoff.Job(task["func"], task["args"], kwargs=task["kwargs"])
                    for task in queued()
                )
        for job in captured:
            job.run()

    effects = dict(JobEffect.objects.values_list("label", "value"))
    assert effects == {
        "typed": {"at": "2026-03-01T12:00:00Z", "price": "9.50", "note": "hi"},
        "kw": {"at": "2026-03-01T12:00:00Z"},
    }

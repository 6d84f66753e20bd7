"""The async entry points, called from async views through ``AsyncClient`` (ASGI).

``apublish``/``apublish_many``, ``astage_task`` and ``UniqueJob.aenqueue`` run the sync
functions with ``sync_to_async(thread_sensitive=True)``: in the thread of the caller's
thread-sensitive work, on its connection. A sync test calling async code through
``async_to_sync`` is that thread, so it sees their rows (and their captured jobs).
The tests run in autocommit, as requests do, so every commit's wake really runs.
"""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.db import transaction
from django.test import AsyncClient
from django_q.models import OrmQ

from django_outbox import apublish, apublish_many, publish
from django_outbox.jobs.staging import astage_task
from django_outbox.models import ArchivedEvent, OutboxEvent, OutboxGroup, Outcome, StagedJob
from tests.conftest import InlineRunner
from tests.docs_examples import async_views
from tests.testapp.models import HandledCall, JobEffect
from tests.uniqueapp.models import JobRun, KeyedJob

pytestmark = pytest.mark.django_db(transaction=True)


class Rollback(Exception):
    pass


def request(method: str, path: str, **data: str):
    client = AsyncClient()
    return async_to_sync(getattr(client, method))(path, data)


def test_an_async_view_publishes_commits_and_wakes_the_stream():
    runner = InlineRunner()
    with runner.capturing():
        response = request("get", "/async/audit-login/", user="ada")

    assert response.status_code == 201
    event = OutboxEvent.objects.get(pk=response.json()["event"])
    assert event.payload["user"] == "ada"
    assert isinstance(event.payload["at"], str)  # a datetime, as DjangoJSONEncoder wrote it
    assert OutboxGroup.objects.count() == 1  # the commit's wake claimed it for a run
    assert [job.func for job in runner.jobs] == ["django_outbox.tasks.run"]
    runner.drain()
    archived = ArchivedEvent.objects.get(event_id=event.pk)
    assert archived.outcome == Outcome.DONE
    assert HandledCall.objects.get().event_ids == [event.pk]


def test_a_transaction_in_a_sync_function_commits_the_row_and_its_event_together():
    runner = InlineRunner()
    with runner.capturing():
        response = request("post", "/async/record/", label="signed-up")

    assert response.status_code == 201
    effect = JobEffect.objects.get(pk=response.json()["effect"])
    assert OutboxEvent.objects.get().payload == {"effect": effect.pk, "label": "signed-up"}
    assert len(runner.jobs) == 1  # woken once, by the commit
    runner.drain()
    assert ArchivedEvent.objects.filter(stream="audit", outcome=Outcome.DONE).count() == 1


def test_a_rolled_back_transaction_in_the_sync_function_leaves_nothing_and_wakes_nothing():
    @sync_to_async
    def record_then_fail() -> None:
        with transaction.atomic():
            JobEffect.objects.create(label="never")
            publish("audit", {"n": 1})
            raise Rollback

    async def view_body() -> None:
        await record_then_fail()

    runner = InlineRunner()
    with runner.capturing(), pytest.raises(Rollback):
        async_to_sync(view_body)()

    assert not JobEffect.objects.exists() and not OutboxEvent.objects.exists()
    assert not runner.jobs


def test_apublish_joins_the_transaction_of_the_thread_it_runs_in():
    """Thread-sensitive: the caller's open transaction holds the rows and their wake."""
    runner = InlineRunner()
    with runner.capturing(), pytest.raises(Rollback), transaction.atomic():
        event_id = async_to_sync(apublish)("audit", {"n": 1})
        assert async_to_sync(apublish_many)("audit", [{"n": 2}, {"n": 3}]) == 2
        assert OutboxEvent.objects.filter(pk=event_id).exists()
        raise Rollback

    assert not OutboxEvent.objects.exists()
    assert not runner.jobs


def test_an_async_view_stages_a_job_that_reaches_django_q2_on_commit():
    runner = InlineRunner()
    with runner.capturing():
        response = request("post", "/async/stage-receipt/")

    assert response.status_code == 201
    runner.drain()
    effect = JobEffect.objects.get(label="receipt")
    assert isinstance(effect.value["at"], str)


def test_astage_task_joins_the_callers_transaction():
    with pytest.raises(Rollback), transaction.atomic():
        async_to_sync(astage_task)("tests.testapp.jobs.record", "never")
        assert OrmQ.objects.count() == 1  # the ORM broker's queue, in this transaction
        raise Rollback

    assert not OrmQ.objects.exists() and not StagedJob.objects.exists()


def test_an_async_view_enqueues_a_unique_job_once_per_key_and_dispatches_it():
    runner = InlineRunner()
    with runner.capturing():
        first = request("post", "/async/rebuild/feed-1/")
        second = request("post", "/async/rebuild/feed-1/")

    assert (first.status_code, second.status_code) == (201, 200)
    assert first.json()["job"] == second.json()["job"]
    assert runner.jobs  # the first commit kicked the dispatch
    runner.drain()
    assert list(JobRun.objects.values_list("key", flat=True)) == ["feed-1"]
    assert KeyedJob.objects.get().state == "processed"


def test_aenqueue_many_creates_the_jobs_in_the_callers_transaction():
    with pytest.raises(Rollback), transaction.atomic():
        created = async_to_sync(KeyedJob.aenqueue_many)([{"key": "a"}, {"key": "b"}])
        assert [job.key for job in created] == ["a", "b"]
        raise Rollback
    assert not KeyedJob.objects.exists()


def test_the_views_are_async():
    import inspect

    views = [async_views.audit_login, async_views.record, async_views.stage_receipt]
    assert all(inspect.iscoroutinefunction(view) for view in [*views, async_views.rebuild])


@pytest.mark.process
def test_a_real_cluster_delivers_what_async_views_published_staged_and_enqueued(tmp_path):
    from tests.procs import fail_on_queue_failures, log_problems, qcluster, wait_until

    with qcluster(log=tmp_path / "qcluster.log") as cluster:
        published = request("get", "/async/audit-login/", user="ada").json()["event"]
        request("post", "/async/stage-receipt/")
        request("post", "/async/rebuild/feed-2/")

        def delivered() -> bool:
            return (
                ArchivedEvent.objects.filter(event_id=published, outcome=Outcome.DONE).exists()
                and JobEffect.objects.filter(label="receipt").exists()
                and JobRun.objects.filter(key="feed-2", ended_at__isnull=False).exists()
            )

        wait_until(
            delivered,
            timeout=60,
            describe=lambda: (
                f"archived {list(ArchivedEvent.objects.values_list('event_id', 'outcome'))}, "
                f"effects {list(JobEffect.objects.values_list('label', flat=True))}, "
                f"jobs {list(KeyedJob.objects.values_list('key', 'state'))}"
            ),
            watch=[cluster],
            check=fail_on_queue_failures,
        )
    assert log_problems(cluster) == []

"""The documentation's code runs: the tutorial, followed as written, delivers its batch.

The tutorial includes its code from ``tests/docs_examples/`` and from the example
project; these tests run that code against the test database.
"""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.db import transaction
from django.test import override_settings
from django.utils.module_loading import import_string
from django_q.models import OrmQ
from django_q.signing import SignedPackage

from django_outbox.checks import check_settings
from django_outbox.inline import run_inline
from django_outbox.models import ArchivedEvent, OutboxGroup, StagedJob
from tests.docs_examples import jobs, staging, tutorial_outbox, tutorial_settings, tutorial_verify

HANDLER = "tests.docs_examples.tutorial_outbox.sync_activities"


def tutorial_outbox_settings() -> dict:
    """The tutorial's DJANGO_OUTBOX, its handler path pointed at where the test keeps it."""
    stream = {**tutorial_settings.DJANGO_OUTBOX["STREAMS"]["marketing"], "HANDLER": HANDLER}
    return {**tutorial_settings.DJANGO_OUTBOX, "STREAMS": {"marketing": stream}}


def test_the_tutorial_settings_pass_the_system_checks():
    assert tutorial_settings.DATABASES["default"]["OPTIONS"]["transaction_mode"] == "IMMEDIATE"
    with override_settings(
        DJANGO_OUTBOX=tutorial_outbox_settings(), Q_CLUSTER=tutorial_settings.Q_CLUSTER
    ):
        assert check_settings() == []


@pytest.mark.django_db
def test_the_tutorial_delivers_every_activity_with_the_inline_runner(
    django_capture_on_commit_callbacks,
):
    tutorial_outbox.SENT.clear()
    with override_settings(DJANGO_OUTBOX=tutorial_outbox_settings()):
        # Step 7: record 1,000 activities, one transaction each; each commit wakes the
        # stream, which queues a run job for a cluster that is not running.
        with django_capture_on_commit_callbacks(execute=True):
            tutorial_verify.record()
        queued = list(OrmQ.objects.all())
        assert queued, "the commits queued run jobs for a cluster"

        report = run_inline(["marketing"], until_empty=True, max_wait_seconds=30)

        assert report.stopped_because == "empty"
        assert tutorial_verify.check() == 1000
        assert len(tutorial_outbox.SENT) == 1000
        status = io.StringIO()
        call_command("outbox_status", "marketing", stdout=status)
        line = status.getvalue().splitlines()[1]
        assert line.split() == ["marketing", "active", "0", "-", "0", "0", "0", "1,000", "0"]

        # The jobs the commits queued for a cluster find their groups done: a cluster
        # started later does nothing more.
        for row in queued:
            task = SignedPackage.loads(row.payload)
            import_string(task["func"])(*task["args"], **task["kwargs"])
        assert ArchivedEvent.objects.filter(stream="marketing").count() == 1000
        assert not OutboxGroup.objects.exists()


# --8<-- [start:testing]
@pytest.mark.django_db
def test_an_activity_of_a_lead_without_email_becomes_a_dead_letter():
    from marketing.models import Lead
    from marketing.services import record_activity

    stream = {
        "HANDLER": "tests.docs_examples.tutorial_outbox.sync_activities",
        "MODEL": "marketing.ContactActivityEvent",
        "MAX_ATTEMPTS": 1,  # no retries in the test
    }
    with override_settings(DJANGO_OUTBOX={"STREAMS": {"marketing": stream}}):
        record_activity(Lead.objects.create(name="Bo", email="bo@example.com"), "call")
        record_activity(Lead.objects.create(name="No Email", email=""), "call")

        run_inline(["marketing"], until_empty=True)  # the pipeline, in this process

    archived = ArchivedEvent.objects.filter(stream="marketing")
    assert sorted(archived.values_list("outcome", flat=True)) == ["done", "failed"]
    assert archived.get(outcome="failed").error == "no email address"


# --8<-- [end:testing]


def run_queued_django_q_tasks() -> None:
    """Run what django-q2's ORM queue holds, as a cluster's worker would, and empty it."""
    for row in OrmQ.objects.all():
        task = SignedPackage.loads(row.payload)
        import_string(task["func"])(*task["args"], **task["kwargs"])
        row.delete()


@pytest.mark.django_db
@override_settings(DJANGO_OUTBOX={"STAGING": {"ALLOWED_MODULES": ["tests.docs_examples.jobs"]}})
def test_the_staged_jobs_guide_stages_on_commit_only(django_capture_on_commit_callbacks):
    jobs.DONE.clear()

    class Rollback(Exception):
        pass

    with pytest.raises(Rollback), transaction.atomic():
        staging.sign_up("Gone", "gone@example.com")
        raise Rollback
    assert not OrmQ.objects.exists() and not StagedJob.objects.exists()

    with django_capture_on_commit_callbacks(execute=True):
        lead = staging.sign_up("Ada", "ada@example.com")
    run_queued_django_q_tasks()

    assert sorted(jobs.DONE) == [("charge", lead.pk), ("welcome", lead.pk)]
    delayed = StagedJob.objects.get()  # the feedback request waits three days
    assert delayed.func.endswith("ask_for_feedback")

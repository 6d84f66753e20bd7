"""The admin: every page renders, actions work, a view-only staff user cannot act."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from datetime import timedelta

import pytest
from blogs.models import Blog, RebuildBlogFeed
from django.conf import settings
from django.contrib import admin
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.db import IntegrityError, connections, transaction
from django.db.models.signals import pre_save
from django.test import override_settings
from django.urls import reverse
from django.utils import timezone
from django_q.models import OrmQ

from django_outbox import publish_many
from django_outbox.conf import get_stream
from django_outbox.jobs.staging import stage_task
from django_outbox.models import (
    ArchivedEvent,
    GroupState,
    HeldKey,
    IdempotencyKey,
    OutboxEvent,
    OutboxGroup,
    Outcome,
    StagedJob,
    StreamState,
)
from django_outbox.streams.groups import group_leases
from django_outbox.unique.dispatch import dispatch
from tests.conftest import InlineRunner, publish_unwoken

pytestmark = pytest.mark.django_db(transaction=True)


def outbox_models() -> list[type]:
    """Every model the admin shows for django_outbox, custom buffers included."""
    from django.apps import apps

    from django_outbox.models.unique import all_kinds

    labels = [m._meta.label for m in admin.site._registry]
    stream_models = {s["MODEL"] for s in settings.DJANGO_OUTBOX["STREAMS"].values() if "MODEL" in s}
    kinds = {kind._meta.label for kind in all_kinds()}
    return [
        apps.get_model(label)
        for label in labels
        if label.startswith("django_outbox.") or label in stream_models | kinds
    ]


@pytest.fixture
def data(handler_mode):
    """A bit of everything: buffer rows, a retrying group, dead letters, staged jobs, keys."""
    publish_unwoken("audit", [{"n": n, "fail": n < 3} for n in range(12)])
    runner = InlineRunner()
    handler_mode("fail-marked")
    runner.distribute("audit")  # batch 10: 7 done, 3 retrying, 2 done in a second group
    outbox = dict(settings.DJANGO_OUTBOX)
    outbox["STAGING"] = {**outbox["STAGING"], "FORWARD_ON_COMMIT": False}
    with override_settings(DJANGO_OUTBOX=outbox), transaction.atomic():
        stage_task("tests.testapp.jobs.record", "later", run_after=timedelta(hours=1))
    IdempotencyKey.objects.create(scope="tests", key="k-1", result={"ok": True})
    HeldKey.objects.create(stream="audit", key="order-7", error="gave up")
    blog = Blog.objects.create(name="Notes")
    RebuildBlogFeed.enqueue(blog=blog)
    OrmQ.objects.all().delete()  # its dispatch queued a task; the tests count their own
    ArchivedEvent.objects.create(
        stream="audit",
        event_id=999,
        data={"id": 999, "stream": "audit", "payload": {"n": 999}, "created_at": None},
        created_at=timezone.now(),
        outcome=Outcome.FAILED,
        error="gave up",
    )
    return runner


def test_every_admin_page_renders_for_a_superuser(admin_client, data):
    pages = [reverse("admin:app_list", args=["django_outbox"]), dashboard_url()]
    for model in outbox_models():
        info = (model._meta.app_label, model._meta.model_name)
        pages.append(reverse("admin:{}_{}_changelist".format(*info)))
        obj = model._default_manager.first()
        if obj is not None:
            pages.append(reverse("admin:{}_{}_change".format(*info), args=[obj.pk]))

    for page in pages:
        response = admin_client.get(page)
        assert response.status_code == 200, page

    labels = {model._meta.label for model in outbox_models()}
    assert labels >= {
        "django_outbox.OutboxEvent",
        "marketing.ContactActivityEvent",  # a custom buffer bound to a stream
        "django_outbox.OutboxGroup",
        "django_outbox.ArchivedEvent",
        "django_outbox.StagedJob",
        "django_outbox.IdempotencyKey",
        "django_outbox.StreamState",
        "django_outbox.HeldKey",
        "blogs.RebuildBlogFeed",  # a unique-job kind
    }


def dashboard_url() -> str:
    return reverse("admin:django_outbox_dashboard")


def test_the_app_index_links_the_dashboard(admin_client):
    response = admin_client.get(reverse("admin:app_list", args=["django_outbox"]))

    assert dashboard_url() in response.content.decode()


def test_the_dashboard_shows_each_stream_its_chart_and_staged_jobs(admin_client, data):
    response = admin_client.get(dashboard_url())

    html = response.content.decode()
    assert 'id="stream-audit"' in html and 'id="stream-marketing"' in html
    assert html.count('<svg class="outbox-chart"') == 2
    assert "1 waiting" in html  # the delayed staged job
    assert response.context["streams"][0]["status"].stream in ("audit", "marketing")
    audit = next(r for r in response.context["streams"] if r["status"].stream == "audit")
    assert audit["done_last_hour"] == 9  # 7 of the first group, 2 of the second
    assert audit["status"].groups_retrying == 1


def test_a_dispatched_job_no_worker_started_shows_as_dispatched(admin_client, data):
    """It holds its unique key, as a pending job does: the admin tells it apart from a
    job that runs."""
    # Dispatched after its commit (or, on PostgreSQL, by the worker that takes the wake
    # its INSERT queued: as here) and not started.
    dispatch(RebuildBlogFeed)
    job = RebuildBlogFeed.objects.get()
    assert (job.state, job.started_at) == ("running", None)
    changelist = reverse("admin:blogs_rebuildblogfeed_changelist")

    listed = admin_client.get(changelist).content.decode()
    dispatched = admin_client.get(changelist, {"stage": "dispatched"}).content.decode()
    running = admin_client.get(changelist, {"stage": "running"}).content.decode()
    dashboard = admin_client.get(dashboard_url()).content.decode()

    assert '<td class="field-stage">dispatched</td>' in listed
    assert f"/{job.pk}/change/" in dispatched and f"/{job.pk}/change/" not in running
    assert "pending: 0, dispatched: 1, running: 0, processed: 0, failed: 0" in dashboard


def archived(n: int, minutes_ago: int, stream: str = "audit", **fields) -> None:
    """*n* done rows archived a second apart within the minute *minutes_ago* minutes ago."""
    minute = timezone.now().replace(second=30, microsecond=0) - timedelta(minutes=minutes_ago)
    ArchivedEvent.objects.bulk_create(
        ArchivedEvent(
            stream=stream,
            event_id=i,
            data={"id": i},
            created_at=minute,
            archived_at=minute - timedelta(seconds=i),
            outcome=Outcome.DONE,
            **fields,
        )
        for i in range(n)
    )


def test_the_throughput_chart_counts_at_most_the_cap_per_stream_and_says_so():
    from django_outbox.admin import chart_svg, throughput
    from django_outbox.base.dialect import database_now

    archived(4, minutes_ago=30)
    archived(3, minutes_ago=2)
    now = database_now("default")

    full = throughput(now, cap=100)["audit"]
    capped = throughput(now, cap=5)["audit"]

    assert (full[(30, "done")], full[(2, "done")]) == (4, 3)
    assert (30, "capped") not in full
    assert (capped[(30, "done")], capped[(2, "done")]) == (2, 3)  # the newest 5 rows
    assert (30, "capped") in capped
    assert "not counted from 30 min ago" in chart_svg(capped, now)


def test_filters_list_configured_streams_and_searches_look_at_the_newest_rows_only(
    admin_client, monkeypatch
):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    archived(3, minutes_ago=50, error="old timeout")
    archived(3, minutes_ago=1, error="new timeout")
    oldest = ArchivedEvent.objects.order_by("id").first()
    monkeypatch.setattr("django_outbox.admin.SCAN_CAP", 3)
    url = reverse("admin:django_outbox_archivedevent_changelist")

    with CaptureQueriesContext(connection) as queries:
        page = admin_client.get(url)
    assert not any("DISTINCT" in q["sql"] for q in queries.captured_queries)
    assert 'href="?stream=marketing"' in page.content.decode()  # no row, still a choice
    found = admin_client.get(url, {"q": "timeout"}).context["cl"].result_list
    assert {row.error for row in found} == {"new timeout"}
    by_id = admin_client.get(url, {"q": str(oldest.pk)}).context["cl"].result_list
    assert [row.pk for row in by_id] == [oldest.pk]  # an id is found however old


def test_machine_written_rows_cannot_be_added_changed_or_deleted(admin_client, data):
    group = OutboxGroup.objects.get()
    assert admin_client.get(reverse("admin:django_outbox_outboxgroup_add")).status_code == 403
    response = admin_client.post(
        reverse("admin:django_outbox_outboxgroup_change", args=[group.pk]), {"attempt": 99}
    )
    assert response.status_code == 403
    delete = reverse(
        "admin:django_outbox_archivedevent_delete", args=[ArchivedEvent.objects.first().pk]
    )
    assert admin_client.post(delete, {"post": "yes"}).status_code == 403


def act(client, model: str, action: str, pks: list) -> list[tuple[str, str]]:
    """Run an admin action on the rows *pks*; the messages shown, as (level, text)."""
    response = client.post(
        reverse(f"admin:django_outbox_{model}_changelist"),
        {"action": action, "_selected_action": [str(pk) for pk in pks]},
        follow=True,
    )
    assert response.status_code == 200
    return [(message.level_tag, message.message) for message in response.context["messages"]]


def test_pause_and_resume_from_the_admin_are_obeyed_by_the_pipeline(admin_client):
    admin_client.get(reverse("admin:django_outbox_streamstate_changelist"))  # rows appear
    act(admin_client, "streamstate", "pause", ["audit"])
    assert StreamState.objects.get(stream="audit").paused

    runner = InlineRunner()
    with runner.capturing():
        publish_many("audit", [{"n": 1}])  # its commit finds the stream paused
    runner.distribute("audit")
    assert OutboxEvent.objects.filter(group_id__isnull=True).count() == 1  # not claimed

    with runner.capturing():
        act(admin_client, "streamstate", "resume", ["audit"])  # resuming wakes the stream
    runner.drain()
    assert OutboxEvent.objects.count() == 0


def test_retry_now_requeues_a_retrying_group(admin_client, data):
    group = OutboxGroup.objects.get(state=GroupState.RETRYING)

    act(admin_client, "outboxgroup", "retry_now", [group.pk])

    group.refresh_from_db()
    assert group.state == GroupState.CLAIMED
    assert OrmQ.objects.count() == 1  # its process job


def test_retry_now_acts_on_the_selected_groups_only(admin_client, data):
    chosen = OutboxGroup.objects.get(state=GroupState.RETRYING)
    other = OutboxGroup.objects.create(
        stream="audit",
        size=1,
        state=GroupState.RETRYING,
        attempt=1,
        next_attempt_at=timezone.now() - timedelta(seconds=5),  # due, but not selected
    )

    act(admin_client, "outboxgroup", "retry_now", [chosen.pk])

    assert OutboxGroup.objects.get(pk=chosen.pk).state == GroupState.CLAIMED
    assert OutboxGroup.objects.get(pk=other.pk).state == GroupState.RETRYING
    assert OrmQ.objects.count() == 1


def test_release_lease_hands_a_running_group_to_a_new_attempt(admin_client, data):
    group = OutboxGroup.objects.get()
    OutboxGroup.objects.filter(pk=group.pk).update(
        state=GroupState.RUNNING, lease_expires_at=timezone.now() + timedelta(hours=1)
    )

    act(admin_client, "outboxgroup", "release_lease", [group.pk])

    group.refresh_from_db()
    assert group.state == GroupState.CLAIMED
    assert OrmQ.objects.count() == 1


def test_dead_letter_archives_the_rows_as_failed(admin_client, data):
    group = OutboxGroup.objects.get()

    act(admin_client, "outboxgroup", "dead_letter", [group.pk])

    assert not OutboxGroup.objects.exists()
    failed = ArchivedEvent.objects.filter(group_id=group.pk, outcome=Outcome.FAILED)
    assert failed.count() == 3
    assert failed.first().error == "dead-lettered from the admin by admin"


def running(group: OutboxGroup) -> OutboxGroup:
    """*group* made a running attempt with an hour of lease left."""
    OutboxGroup.objects.filter(pk=group.pk).update(
        state=GroupState.RUNNING, lease_expires_at=timezone.now() + timedelta(hours=1)
    )
    return OutboxGroup.objects.get(pk=group.pk)


@contextlib.contextmanager
def transactional_attempt(group: OutboxGroup) -> Iterator[None]:
    """*group*'s row locked from another connection, as a running ``TRANSACTIONAL``
    attempt holds it until its handler ends; the block must end while it holds it."""
    locked, ended = threading.Event(), threading.Event()
    gave_up = []

    def attempt() -> None:
        try:
            with transaction.atomic():
                group_leases(get_stream(group.stream)).lock(group.pk, group.attempt)
                locked.set()
                gave_up.append(not ended.wait(30))
        finally:
            connections.close_all()

    thread = threading.Thread(target=attempt)
    thread.start()
    assert locked.wait(10)
    try:
        yield
    finally:
        ended.set()
        thread.join(30)
    assert gave_up == [False], "the action waited for the running attempt to end"


@pytest.mark.postgres
@pytest.mark.parametrize("action", ["release_lease", "dead_letter"])
def test_an_action_on_a_running_transactional_attempt_answers_at_once(admin_client, data, action):
    group = running(OutboxGroup.objects.get())

    with transactional_attempt(group):
        shown = act(admin_client, "outboxgroup", action, [group.pk])

    assert shown[-1] == (
        "warning",
        f"1 group(s) not {'released' if action == 'release_lease' else 'dead-lettered'}: a "
        "running attempt holds their row lock (a TRANSACTIONAL handler, whose writes commit "
        "or roll back with the group, or a finalize). Nothing was changed for them; try "
        f"again once the attempt has ended: {group.pk}.",
    )
    after = OutboxGroup.objects.values("state", "attempt", "lease_expires_at").get(pk=group.pk)
    assert after == {
        "state": GroupState.RUNNING,
        "attempt": group.attempt,
        "lease_expires_at": group.lease_expires_at,
    }
    assert not ArchivedEvent.objects.filter(group_id=group.pk, outcome=Outcome.FAILED).exists()
    assert OutboxEvent.objects.filter(group_id=group.pk).count() == 3
    assert not OrmQ.objects.exists()


def test_dead_letter_of_a_running_group_warns_that_its_worker_may_still_deliver(admin_client, data):
    group = running(OutboxGroup.objects.get())

    shown = act(admin_client, "outboxgroup", "dead_letter", [group.pk])

    assert shown == [
        ("info", "1 group(s), 3 row(s) dead-lettered (see the archive)."),
        (
            "warning",
            "1 of them were running: their worker may still deliver their rows (its handler "
            "runs on; only its finalize finds the group gone). Check what was delivered "
            "before you replay them.",
        ),
    ]
    # The rows are kept as dead letters, for replay.
    failed = ArchivedEvent.objects.filter(group_id=group.pk, outcome=Outcome.FAILED)
    assert failed.count() == 3
    assert not OutboxGroup.objects.exists()


def test_dead_letter_of_a_waiting_group_does_not_warn(admin_client, data):
    group = OutboxGroup.objects.get(state=GroupState.RETRYING)

    shown = act(admin_client, "outboxgroup", "dead_letter", [group.pk])

    assert shown == [("info", "1 group(s), 3 row(s) dead-lettered (see the archive).")]


def test_replay_publishes_dead_letters_once(admin_client, data):
    letter = ArchivedEvent.objects.get(event_id=999)
    before = OutboxEvent.objects.count()

    act(admin_client, "archivedevent", "replay", [letter.pk])
    act(admin_client, "archivedevent", "replay", [letter.pk])

    assert OutboxEvent.objects.count() == before + 1
    assert OutboxEvent.objects.order_by("-id").first().payload == {"n": 999}


def test_release_lets_a_held_key_go_on(admin_client, data):
    held = HeldKey.objects.get()

    act(admin_client, "heldkey", "release", [held.pk])

    assert not HeldKey.objects.exists()


def test_forward_now_hands_a_delayed_staged_job_to_django_q2(admin_client, data):
    job = StagedJob.objects.get()

    act(admin_client, "stagedjob", "forward_now", [job.pk])

    assert not StagedJob.objects.exists()
    assert OrmQ.objects.count() == 1


def test_a_batch_size_override_is_editable_and_obeyed(admin_client):
    admin_client.get(reverse("admin:django_outbox_streamstate_changelist"))
    response = admin_client.post(
        reverse("admin:django_outbox_streamstate_change", args=["audit"]),
        {"batch_size_override": "3"},
    )
    assert response.status_code == 302
    runner = InlineRunner()
    with runner.capturing():
        publish_many("audit", [{"n": n} for n in range(7)])
    runner.drain()
    assert ArchivedEvent.objects.values("group_id").distinct().count() == 3


def test_a_batch_size_override_writes_back_none_of_the_pipelines_columns(admin_client):
    """The pipeline moves the claim floor while the operator's request runs: the save
    must not write the value the request read back over it."""

    def pipeline_moves_the_floor(sender, instance, **kwargs):
        StreamState.objects.filter(stream=instance.stream).update(
            claim_floor=500, floor_pending=600, floor_barrier=[7]
        )

    pre_save.connect(pipeline_moves_the_floor, sender=StreamState)
    try:
        response = admin_client.post(
            reverse("admin:django_outbox_streamstate_change", args=["audit"]),
            {"batch_size_override": "3"},
        )
    finally:
        pre_save.disconnect(pipeline_moves_the_floor, sender=StreamState)
    assert response.status_code == 302
    state = StreamState.objects.get(stream="audit")
    assert state.batch_size_override == 3
    assert (state.claim_floor, state.floor_pending, state.floor_barrier) == (500, 600, [7])


def test_the_stream_state_changelist_writes_nothing_and_migrate_adds_missing_rows(admin_client):
    StreamState.objects.all().delete()

    response = admin_client.get(reverse("admin:django_outbox_streamstate_changelist"))

    assert response.status_code == 200
    assert not StreamState.objects.exists()
    assert "No state row yet for audit, marketing" in response.content.decode()
    call_command("migrate", verbosity=0)
    assert set(StreamState.objects.values_list("stream", flat=True)) == {"audit", "marketing"}


@pytest.mark.parametrize("value", ["0", "100001"])
def test_a_batch_size_override_outside_its_bounds_is_refused(admin_client, value):
    response = admin_client.post(
        reverse("admin:django_outbox_streamstate_change", args=["audit"]),
        {"batch_size_override": value},
    )

    assert response.status_code == 200  # the form again, with its error
    assert "Ensure this value is" in response.content.decode()
    assert StreamState.objects.get(stream="audit").batch_size_override is None
    with pytest.raises(IntegrityError), transaction.atomic():
        StreamState.objects.filter(stream="audit").update(batch_size_override=int(value))


def test_changing_a_batch_size_needs_the_operate_permission(client):
    user = User.objects.create_user("editor", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(codename__in=["view_streamstate", "change_streamstate"])
    )
    client.force_login(user)
    change = reverse("admin:django_outbox_streamstate_change", args=["audit"])

    assert client.post(change, {"batch_size_override": "3"}).status_code == 403
    assert StreamState.objects.get(stream="audit").batch_size_override is None
    changelist = client.get(reverse("admin:django_outbox_streamstate_changelist"))
    assert 'name="form-0-batch_size_override"' not in changelist.content.decode()


# -- a view-only staff user ----------------------------------------------------------------


@pytest.fixture
def viewer_client(client):
    user = User.objects.create_user("viewer", password="x", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(
            content_type__app_label__in=[
                "django_outbox",
                "django_outbox_tasks",
                "marketing",
                "blogs",
                "uniqueapp",
            ],
            codename__startswith="view_",
        )
    )
    client.force_login(user)
    return client


def test_a_view_only_user_sees_every_page(viewer_client, data):
    assert viewer_client.get(dashboard_url()).status_code == 200
    for model in outbox_models():
        info = (model._meta.app_label, model._meta.model_name)
        assert viewer_client.get(reverse("admin:{}_{}_changelist".format(*info))).status_code == 200


@pytest.mark.parametrize(
    ("model", "action"),
    [
        ("streamstate", "pause"),
        ("outboxgroup", "retry_now"),
        ("outboxgroup", "release_lease"),
        ("outboxgroup", "dead_letter"),
        ("archivedevent", "replay"),
        ("stagedjob", "forward_now"),
        ("heldkey", "release"),
    ],
)
def test_a_view_only_user_cannot_run_any_action(viewer_client, data, model, action):
    viewer_client.get(reverse("admin:django_outbox_streamstate_changelist"))
    changelist = viewer_client.get(reverse(f"admin:django_outbox_{model}_changelist"))
    assert f'value="{action}"' not in changelist.content.decode()
    before = snapshot()
    pks = {
        "streamstate": ["audit"],
        "outboxgroup": list(OutboxGroup.objects.values_list("pk", flat=True)),
        "archivedevent": list(ArchivedEvent.objects.values_list("pk", flat=True)),
        "stagedjob": list(StagedJob.objects.values_list("pk", flat=True)),
        "heldkey": list(HeldKey.objects.values_list("pk", flat=True)),
    }[model]

    viewer_client.post(
        reverse(f"admin:django_outbox_{model}_changelist"),
        {"action": action, "_selected_action": [str(pk) for pk in pks]},
    )

    assert snapshot() == before


def snapshot() -> tuple:
    return (
        list(StreamState.objects.order_by("stream").values_list("stream", "paused")),
        list(OutboxGroup.objects.values_list("id", "state", "lease_expires_at", "next_attempt_at")),
        ArchivedEvent.objects.count(),
        OutboxEvent.objects.count(),
        StagedJob.objects.count(),
        OrmQ.objects.count(),
        HeldKey.objects.count(),
    )


def test_an_operator_with_the_custom_permission_may_act(client, data):
    user = User.objects.create_user("operator", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(codename__in=["view_streamstate", "operate_streamstate"])
    )
    client.force_login(user)
    client.get(reverse("admin:django_outbox_streamstate_changelist"))

    act(client, "streamstate", "pause", ["marketing"])

    assert StreamState.objects.get(stream="marketing").paused

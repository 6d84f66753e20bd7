"""The Prometheus metrics view: scraped with a real client, parsed as exposition format."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.contrib.auth.models import Permission, User
from django.db import transaction
from django.test import override_settings
from django_q.models import OrmQ
from prometheus_client.parser import text_string_to_metric_families

from django_outbox import publish_many
from django_outbox.jobs.staging import stage_task
from django_outbox.models import StagedJob
from django_outbox.streams.steer import set_paused
from tests.conftest import publish_unwoken

pytestmark = pytest.mark.django_db(transaction=True)

URL = "/outbox/metrics"
TOKEN = "a-token-of-at-least-16-chars"


def samples(body: bytes) -> dict[tuple[str, tuple], float]:
    """Every sample of the exposition text, keyed by (name, sorted labels)."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
    }


@pytest.fixture
def staff_client(client):
    user = User.objects.create_user("ops", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_streamstate"))
    client.force_login(user)
    return client


def test_anonymous_users_and_users_without_the_view_permission_are_refused(client):
    assert client.get(URL).status_code == 403
    client.force_login(User.objects.create_user("someone"))
    assert client.get(URL).status_code == 403
    client.force_login(User.objects.create_user("staff-elsewhere", is_staff=True))
    response = client.get(URL)
    assert response.status_code == 403
    assert b"django_outbox.view_streamstate" in response.content


def test_a_superuser_and_a_user_with_the_view_permission_may_scrape(client, staff_client):
    assert staff_client.get(URL).status_code == 200
    client.force_login(User.objects.create_superuser("root", "root@example.com", "x"))
    assert client.get(URL).status_code == 200


def test_a_bearer_token_is_accepted_only_when_configured_and_equal(client):
    assert client.get(URL, headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 403
    outbox = {**settings.DJANGO_OUTBOX, "METRICS_TOKEN": TOKEN}
    with override_settings(DJANGO_OUTBOX=outbox):
        assert client.get(URL, headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
        assert client.get(URL, headers={"Authorization": "Bearer wrong"}).status_code == 403


def test_a_scrape_reports_backlog_groups_archive_and_staged_jobs(staff_client, inline):
    with inline.capturing():
        publish_many("audit", [{"n": n} for n in range(25)])  # its commit starts a run
    inline.drain()  # batch 10: 25 rows archived in 3 groups
    publish_unwoken("audit", [{"n": n} for n in range(7)])  # waiting for distribute
    set_paused("marketing", True)
    outbox = dict(settings.DJANGO_OUTBOX)
    outbox["STAGING"] = {**outbox["STAGING"], "FORWARD_ON_COMMIT": False}
    with override_settings(DJANGO_OUTBOX=outbox), transaction.atomic():
        for n in range(3):
            stage_task("tests.testapp.jobs.record", f"job-{n}")
    StagedJob.objects.filter(pk=StagedJob.objects.order_by("id")[0].pk).update(last_error="gone")

    response = staff_client.get(URL)

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=")
    values = samples(response.content)
    assert values[("django_outbox_backlog_rows", (("stream", "audit"),))] == 7
    assert values[("django_outbox_backlog_rows", (("stream", "marketing"),))] == 0
    assert values[("django_outbox_stream_paused", (("stream", "marketing"),))] == 1
    assert values[("django_outbox_stream_paused", (("stream", "audit"),))] == 0
    assert values[("django_outbox_oldest_unclaimed_age_seconds", (("stream", "audit"),))] >= 0
    done = ("django_outbox_archived_last_hour_rows", (("outcome", "done"), ("stream", "audit")))
    assert values[done] == 25
    for state in ("claimed", "running", "retrying"):
        assert values[("django_outbox_groups", (("state", state), ("stream", "audit")))] == 0
    assert values[("django_outbox_staged_jobs", (("state", "waiting"),))] == 2
    assert values[("django_outbox_staged_jobs", (("state", "kept"),))] == 1
    assert values[("django_outbox_scrape_duration_seconds", ())] > 0
    assert OrmQ.objects.count() == 0  # a scrape changes nothing


def test_unique_jobs_are_counted_per_kind_and_state(staff_client):
    from blogs.models import Blog, RebuildBlogFeed

    from django_outbox.unique.dispatch import dispatch

    for name in ("a", "b", "c"):
        RebuildBlogFeed.enqueue(blog=Blog.objects.create(name=name))
    dispatch(RebuildBlogFeed)  # what a worker taking the commits' wake does (PostgreSQL)
    RebuildBlogFeed.objects.filter(pk=RebuildBlogFeed.objects.order_by("id")[0].pk).update(
        state="failed"
    )

    values = samples(staff_client.get(URL).content)

    kind = "blogs.RebuildBlogFeed"
    counts = {
        state: values[("django_outbox_unique_jobs", (("kind", kind), ("state", state)))]
        for state in ("pending", "dispatched", "running", "processed", "failed")
    }
    assert sum(counts.values()) == 3
    assert counts["failed"] == 1
    # Dispatched and not started (no worker): not counted as running.
    assert counts["dispatched"] == 2
    assert counts["running"] == counts["processed"] == 0

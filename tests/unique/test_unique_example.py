"""The example project's kind: a burst of posts gets one feed rebuild, which writes the feed."""

from __future__ import annotations

import pytest
from blogs.models import Blog, RebuildBlogFeed
from blogs.services import publish_post

from django_outbox.models import JobState
from django_outbox.transport import handoff

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_burst_before_the_rebuild_starts_is_absorbed_by_it():
    blog = Blog.objects.create(name="notes")
    with handoff.capture() as queue:
        rebuild, _ = RebuildBlogFeed.enqueue(blog=blog)  # dispatched, no worker yet
        posts = [publish_post(blog, f"post {n}") for n in range(3)]
        assert list(RebuildBlogFeed.objects.values_list("pk", flat=True)) == [rebuild.pk]
        while queue:
            queue.popleft().run()

    blog.refresh_from_db()
    assert [entry["id"] for entry in blog.feed] == [post.pk for post in reversed(posts)]
    assert RebuildBlogFeed.objects.get().state == JobState.PROCESSED


def test_a_burst_of_posts_is_rebuilt_once_and_the_feed_lists_them_newest_first(monkeypatch):
    blog = Blog.objects.create(name="notes")
    posts = []
    rebuild = RebuildBlogFeed.perform

    def a_burst_comes_while_it_runs(job, heartbeat):
        if not posts:
            posts.extend(publish_post(blog, f"post {n}") for n in range(3))
            assert RebuildBlogFeed.objects.filter(state=JobState.PENDING).count() == 1
        return rebuild(job, heartbeat)

    monkeypatch.setattr(RebuildBlogFeed, "perform", a_burst_comes_while_it_runs)
    with handoff.capture() as queue:
        RebuildBlogFeed.enqueue(blog=blog)
        while queue:
            queue.popleft().run()

    blog.refresh_from_db()
    assert [entry["id"] for entry in blog.feed] == [post.pk for post in reversed(posts)]
    assert list(RebuildBlogFeed.objects.values_list("state", flat=True)) == [
        JobState.PROCESSED,
        JobState.PROCESSED,
    ]


def test_the_publish_view_enqueues_a_task_only_where_django_tasks_exists(client):
    from blogs.models import Blog
    from django.conf import settings

    blog = Blog.objects.create(name="Blog")
    with handoff.capture():
        response = client.post(f"/blogs/{blog.pk}/posts/", {"title": "Hello"})
    assert response.status_code == 201
    assert (response.json()["task"] is not None) == settings.TASKS_AVAILABLE

"""The example project's kind: a burst of posts gets one feed rebuild, which writes the feed."""

from __future__ import annotations

import pytest
from blogs.models import Blog, RebuildBlogFeed
from blogs.services import publish_post

from django_outbox import transport
from django_outbox.models import JobState

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_burst_of_posts_is_rebuilt_once_and_the_feed_lists_them_newest_first():
    blog = Blog.objects.create(name="notes")
    with transport.capture() as queue:
        RebuildBlogFeed.enqueue(blog=blog)  # a rebuild is running when the burst comes
        titles = [f"post {n}" for n in range(3)]
        posts = [publish_post(blog, title) for title in titles]
        assert RebuildBlogFeed.objects.filter(state=JobState.PENDING).count() == 1
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
    with transport.capture():
        response = client.post(f"/blogs/{blog.pk}/posts/", {"title": "Hello"})
    assert response.status_code == 201
    assert (response.json()["task"] is not None) == settings.TASKS_AVAILABLE

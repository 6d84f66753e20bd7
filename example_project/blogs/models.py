"""Models of the example `blogs` app: blogs, posts, and the job that rebuilds a feed."""

from __future__ import annotations

from collections.abc import Callable

from django.db import models
from django.db.models.functions import Now

from django_outbox.models import UniqueJob

FEED_SIZE = 20


class Blog(models.Model):
    name = models.CharField(max_length=100)
    feed = models.JSONField(default=list, blank=True, help_text="The latest posts, newest first.")
    feed_built_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return self.name


class Post(models.Model):
    blog = models.ForeignKey(Blog, on_delete=models.CASCADE, related_name="posts")
    title = models.CharField(max_length=200)
    published_at = models.DateTimeField(db_default=Now())
    followers_notified_at = models.DateTimeField(
        null=True, blank=True, help_text="Set by the notify_followers task (Django 6.0+)."
    )

    def __str__(self) -> str:
        return self.title


# --8<-- [start:kind]
class RebuildBlogFeed(UniqueJob):
    """Rebuild one blog's feed. Ten posts published in a burst need one rebuild, not ten.

    Unique per blog until a worker starts it (a burst of posts shares one rebuild, pending
    or dispatched) and while executing (two rebuilds of a blog never race); a post
    published during a rebuild gets a fresh pending rebuild that runs after it.
    """

    blog = models.ForeignKey(Blog, on_delete=models.CASCADE)

    class Job:
        unique_fields = ["blog"]
        max_attempts = 5
        backoff_seconds = 5
        concurrency = 4
        lease_seconds = 60
        retention_days = 7

    def perform(self, heartbeat: Callable[[], None]) -> None:
        posts = self.blog.posts.order_by("-published_at", "-id").values(
            "id", "title", "published_at"
        )[:FEED_SIZE]
        feed = [
            {"id": post["id"], "title": post["title"], "at": post["published_at"].isoformat()}
            for post in posts
        ]
        heartbeat()  # still ours: write the feed
        Blog.objects.filter(pk=self.blog_id).update(feed=feed, feed_built_at=Now())


# --8<-- [end:kind]

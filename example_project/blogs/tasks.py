"""The blog application's ``django.tasks`` tasks (Django 6.0+; see blogs.services)."""

from __future__ import annotations

# --8<-- [start:task]
from django.db.models.functions import Now
from django.tasks import task

from blogs.models import Post


@task
def notify_followers(post_id: int) -> dict:
    """Tell the followers of the post's blog about it (here: stamp the post, once)."""
    notified = Post.objects.filter(pk=post_id, followers_notified_at=None).update(
        followers_notified_at=Now()
    )
    return {"post": post_id, "notified": bool(notified)}


# --8<-- [end:task]

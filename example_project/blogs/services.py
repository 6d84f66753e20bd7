"""What the blog application does: publish a post, have the feed rebuilt once, and (on
Django 6.0+) tell the blog's followers through a ``django.tasks`` task."""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.db import transaction

from blogs.models import Blog, Post, RebuildBlogFeed


def tasks_available() -> bool:
    """Whether the django.tasks backend is installed (Django 6.0+)."""
    return apps.is_installed("django_outbox.tasks_backend")


# --8<-- [start:enqueue]
def publish_post(blog: Blog, title: str) -> Post:
    """Save a post and ask for its blog's feed rebuild in the same transaction.

    If a rebuild of this blog has not started yet, that one will include the post.
    """
    with transaction.atomic():
        post = Post.objects.create(blog=blog, title=title)
        RebuildBlogFeed.enqueue(blog=blog)
    return post


# --8<-- [end:enqueue]


# --8<-- [start:notify]
def publish_and_notify(blog: Blog, title: str) -> tuple[Post, Any]:
    """:func:`publish_post`, and on Django 6.0+ enqueue ``notify_followers`` (a ``@task``)
    in the same transaction: the post and its task commit together, or neither does.

    Returns the post and the task's ``TaskResult`` (None without django.tasks).
    """
    with transaction.atomic():
        post = publish_post(blog, title)
        if not tasks_available():
            return post, None
        from blogs.tasks import notify_followers

        return post, notify_followers.enqueue(post.pk)


# --8<-- [end:notify]

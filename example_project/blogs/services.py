"""What the blog application does: publish a post, and have the feed rebuilt once."""

from __future__ import annotations

from django.db import transaction

from blogs.models import Blog, Post, RebuildBlogFeed


def publish_post(blog: Blog, title: str) -> Post:
    """Save a post and ask for its blog's feed rebuild in the same transaction.

    If a rebuild of this blog is already pending, that one will include the post.
    """
    with transaction.atomic():
        post = Post.objects.create(blog=blog, title=title)
        RebuildBlogFeed.enqueue(blog=blog)
    return post

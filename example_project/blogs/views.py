"""Two views of the blog application: publish a post, and follow its task."""

from __future__ import annotations

from django.http import Http404, HttpRequest, JsonResponse
from django.shortcuts import get_object_or_404
from django.views.decorators.http import require_GET, require_POST

from blogs.models import Blog
from blogs.services import publish_and_notify, tasks_available


@require_POST
def publish(request: HttpRequest, blog_id: int) -> JsonResponse:
    """POST ``title``: the post, its feed rebuild and its notification task commit at once."""
    blog = get_object_or_404(Blog, pk=blog_id)
    post, result = publish_and_notify(blog, request.POST.get("title", "Untitled")[:200])
    return JsonResponse({"post": post.pk, "task": result.id if result else None}, status=201)


@require_GET
def task_status(request: HttpRequest, task_id: str) -> JsonResponse:
    """The ``notify_followers`` task's status and return value, read back by django.tasks."""
    if not tasks_available():
        raise Http404("django.tasks needs Django 6.0+")
    from django.tasks.exceptions import TaskResultDoesNotExist

    from blogs.tasks import notify_followers

    try:
        result = notify_followers.get_result(task_id)
    except TaskResultDoesNotExist as exc:
        raise Http404("no such task") from exc
    return JsonResponse(
        {
            "status": result.status,
            "attempts": result.attempts,
            "return_value": result.return_value if result.status == "SUCCESSFUL" else None,
        }
    )

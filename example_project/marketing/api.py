"""A fake bulk marketing API: counts requests and can inject transient failures.

It stands in for a rate-limited remote service with a bulk endpoint. Every request is
recorded as an :class:`~marketing.models.ApiRequest` row so that requests made by any
worker process can be counted. ``MARKETING_API = {"FAIL_EVERY": n}`` in settings makes
every n-th request fail with a transient error (0 disables it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.conf import settings

from marketing.models import ApiRequest


class TransientAPIError(Exception):
    """The service is unavailable for a moment: retry the whole request later."""


@dataclass
class BulkResponse:
    accepted: int
    rejected: dict[int, str] = field(default_factory=dict)


def bulk_upsert_activities(records: list[dict]) -> BulkResponse:
    """Send up to a few thousand activity records in one request."""
    fail_every = int(getattr(settings, "MARKETING_API", {}).get("FAIL_EVERY", 0))
    request = ApiRequest.objects.create(size=len(records), succeeded=True)
    if fail_every and request.pk % fail_every == 0:
        request.succeeded = False
        request.error = "503 Service Unavailable"
        request.save(update_fields=["succeeded", "error"])
        raise TransientAPIError("marketing API answered 503 Service Unavailable")
    rejected = {r["ref"]: "lead has no email address" for r in records if not r["email"]}
    return BulkResponse(accepted=len(records) - len(rejected), rejected=rejected)

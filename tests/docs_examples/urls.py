"""The metrics guide's URLconf line; ``tests/docs/test_docs_examples.py`` resolves it."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver, include, path

urlpatterns: list[URLPattern | URLResolver] = []

# --8<-- [start:metrics]
urlpatterns += [path("outbox/", include("django_outbox.urls"))]  # serves /outbox/metrics
# --8<-- [end:metrics]

"""URLs of django_outbox: ``path("outbox/", include("django_outbox.urls"))``."""

from django.urls import path

from django_outbox.metrics import metrics_view

app_name = "django_outbox"
urlpatterns = [path("metrics", metrics_view, name="metrics")]

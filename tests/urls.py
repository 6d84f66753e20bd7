from blogs import views as blogs
from django.contrib import admin
from django.urls import include, path

from tests.docs_examples import async_views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("outbox/", include("django_outbox.urls")),
    path("blogs/<int:blog_id>/posts/", blogs.publish),
    path("tasks/<str:task_id>/", blogs.task_status),
    path("async/audit-login/", async_views.audit_login),
    path("async/record/", async_views.record),
    path("async/stage-receipt/", async_views.stage_receipt),
    path("async/rebuild/<str:key>/", async_views.rebuild),
]

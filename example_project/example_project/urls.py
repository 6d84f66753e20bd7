from blogs import views as blogs
from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("outbox/", include("django_outbox.urls")),  # /outbox/metrics (staff or token)
    path("blogs/<int:blog_id>/posts/", blogs.publish, name="blogs-publish"),
    path("tasks/<str:task_id>/", blogs.task_status, name="blogs-task"),
]

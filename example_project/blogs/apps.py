from django.apps import AppConfig


class BlogsConfig(AppConfig):
    name = "blogs"
    default_auto_field = "django.db.models.BigAutoField"

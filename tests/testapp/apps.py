import os

from django.apps import AppConfig


class TestAppConfig(AppConfig):
    name = "tests.testapp"
    label = "testapp"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        if os.environ.get("OUTBOX_TEST_STALL_ENQUEUE"):
            from django_q.signals import pre_enqueue

            from tests.testapp.jobs import stall_before_enqueue

            pre_enqueue.connect(stall_before_enqueue, dispatch_uid="outbox-test-stall")

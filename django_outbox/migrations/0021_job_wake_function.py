from django.db import migrations

from django_outbox.streams.sql import wake_guard


def replace_function(apps, schema_editor):
    wake_guard.replace_job_function(schema_editor)


class Migration(migrations.Migration):
    """The job guard queues the wake itself, and relies on one still untaken."""

    dependencies = [
        ('django_outbox', '0020_outboxevent_order_key'),
    ]

    operations = [
        migrations.RunPython(replace_function, migrations.RunPython.noop, elidable=False),
    ]

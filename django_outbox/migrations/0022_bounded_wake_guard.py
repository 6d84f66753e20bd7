from django.db import migrations

from django_outbox.streams.sql import wake_guard


def replace_functions(apps, schema_editor):
    wake_guard.replace_functions(schema_editor)


class Migration(migrations.Migration):
    """The wake guard takes at most one lock per stream (and kind) per transaction."""

    dependencies = [
        ('django_outbox', '0021_job_wake_function'),
    ]

    operations = [
        migrations.RunPython(replace_functions, migrations.RunPython.noop, elidable=False),
    ]

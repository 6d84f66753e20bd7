"""The wake guard's function of streams, which now also queues a stream's wake in the
INSERT of ``publish()`` (django_outbox.streams.sql.wake_guard), in place of the one that
could only skip it. 0001_initial installs the same on a new database; this brings one
migrated before up to date."""

from django.db import migrations

from django_outbox.streams.sql import wake_guard


def install(apps, schema_editor):
    wake_guard.create_functions(schema_editor)


class Migration(migrations.Migration):
    dependencies = [("django_outbox", "0001_initial")]

    operations = [
        # Unapplied, nothing to undo: 0001_initial's functions are these same ones.
        migrations.RunPython(install, migrations.RunPython.noop, elidable=False),
    ]

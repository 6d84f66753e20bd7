"""The wake guard's function of streams, asked once per transaction and stream: the
caller's record of its answer replaces the function's transaction-local settings, and
one statement reads what decides (django_outbox.streams.sql.wake_guard). 0001_initial
installs the same on a new database; this brings one migrated before up to date."""

from django.db import migrations

from django_outbox.streams.sql import wake_guard


def install(apps, schema_editor):
    wake_guard.create_functions(schema_editor)


class Migration(migrations.Migration):
    dependencies = [("django_outbox", "0002_publish_wake")]

    operations = [
        # Unapplied, nothing to undo: 0001_initial's functions are these same ones.
        migrations.RunPython(install, migrations.RunPython.noop, elidable=False),
    ]

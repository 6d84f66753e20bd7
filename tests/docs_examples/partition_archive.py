"""A project's migration that partitions the outbox archive (docs/how-to/retention.md).

``tests/archive/test_partitions.py`` applies its operation to the test database's archive.
"""

from __future__ import annotations

from django.db import migrations

from django_outbox.operations import PartitionArchive


# --8<-- [start:migration]
class Migration(migrations.Migration):
    dependencies = [("django_outbox", "0001_initial")]

    operations = [
        PartitionArchive(interval="1 day"),
    ]


# --8<-- [end:migration]

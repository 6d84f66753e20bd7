from django.db import migrations

# --8<-- [start:guard]
from django_outbox.operations import GuardOrderKey


class Migration(migrations.Migration):
    dependencies = [
        ('testapp', '0008_orderedevent_trace_context'),
    ]

    operations = [
        GuardOrderKey('orderedevent', 'aggregate_id'),
    ]
# --8<-- [end:guard]

from django.db import migrations

from django_outbox.operations import GuardOrderKey


class Migration(migrations.Migration):
    """An ordered row's key cannot change while the row is in a group."""

    dependencies = [
        ('django_outbox', '0022_bounded_wake_guard'),
    ]

    operations = [
        GuardOrderKey('outboxevent', 'order_key'),
    ]

"""The generic buffer's index of ordered rows by key, dropped: the ordered claim reads
no key's first waiting row since the claim floor starts every claim at or below every
waiting row (django_outbox.streams.sql.ordered), so the index only cost ordered
streams' writes."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("django_outbox", "0003_publish_wake_asked_once")]

    operations = [
        migrations.RemoveIndex(model_name="outboxevent", name="outbox_event_keyed"),
    ]

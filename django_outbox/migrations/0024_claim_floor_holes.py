from django.db import migrations, models

from django_outbox.streams.sql import claim_floor

BUFFER = "django_outbox_outboxevent"


def install_trigger(apps, schema_editor):
    """The floor's functions, and its trigger on the generic buffer (PostgreSQL); the
    trigger on a stream's own buffer table is put there after ``migrate``."""
    connection = schema_editor.connection
    statements = claim_floor.create_functions(connection)
    statements += claim_floor.trigger_statements(connection, BUFFER, None)
    for sql in statements:
        schema_editor.execute(sql, params=None)


def drop_trigger(apps, schema_editor):
    connection = schema_editor.connection
    for table in claim_floor.triggered_tables(connection):
        for sql in claim_floor.drop_trigger_statements(connection, table):
            schema_editor.execute(sql, params=None)
    for sql in claim_floor.drop_functions(connection):
        schema_editor.execute(sql, params=None)


class Migration(migrations.Migration):

    dependencies = [
        ('django_outbox', '0023_outboxevent_order_key_guard'),
    ]

    operations = [
        migrations.AddField(
            model_name='streamstate',
            name='floor_barrier',
            field=models.JSONField(blank=True, editable=False, help_text="The transactions the claim floor's next move waits for (64-bit ids).", null=True),
        ),
        migrations.AddField(
            model_name='streamstate',
            name='floor_pending',
            field=models.BigIntegerField(default=0, editable=False, help_text="The id the claim floor may move to next; a buffer insert at or below it takes the floor's lock (see django_outbox.streams.claim_floor)."),
        ),
        migrations.CreateModel(
            name='FloorHole',
            fields=[
                ('id', models.BigAutoField(primary_key=True, serialize=False)),
                ('stream', models.CharField(max_length=64)),
                ('low', models.BigIntegerField()),
                ('high', models.BigIntegerField()),
            ],
            options={
                'verbose_name': 'claim floor hole',
                'indexes': [models.Index(fields=['stream', 'low'], name='outbox_floorhole_low')],
            },
        ),
        migrations.RunPython(install_trigger, drop_trigger, elidable=False),
    ]

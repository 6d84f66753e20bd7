from django.db import migrations, models

from django_outbox.streams.sql import wake_guard


def create_function(apps, schema_editor):
    wake_guard.create_function(schema_editor)


def drop_function(apps, schema_editor):
    wake_guard.drop_function(schema_editor)


class Migration(migrations.Migration):

    dependencies = [
        ('django_outbox', '0012_streamstate_claim_floor'),
    ]

    operations = [
        migrations.AddField(
            model_name='streamstate',
            name='wake_epoch',
            field=models.BigIntegerField(default=0, editable=False, help_text='Raised by a run about to end; publishers that skipped their wake under the previous value are waited for (see django_outbox.streams.sql.wake_guard).'),
        ),
        migrations.RunPython(create_function, drop_function, elidable=False),
    ]

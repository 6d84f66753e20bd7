from django.db import migrations, models

from django_outbox.streams.sql import wake_guard


def create_function(apps, schema_editor):
    wake_guard.create_job_function(schema_editor)


def drop_function(apps, schema_editor):
    wake_guard.drop_job_function(schema_editor)


class Migration(migrations.Migration):

    dependencies = [
        ('django_outbox', '0013_streamstate_wake_epoch'),
    ]

    operations = [
        migrations.CreateModel(
            name='KindState',
            fields=[
                ('kind', models.CharField(max_length=200, primary_key=True, serialize=False)),
                ('wake_epoch', models.BigIntegerField(default=0, editable=False)),
            ],
            options={
                'verbose_name': 'job kind state',
            },
        ),
        migrations.RunPython(create_function, drop_function, elidable=False),
    ]

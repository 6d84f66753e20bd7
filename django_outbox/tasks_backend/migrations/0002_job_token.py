from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_outbox_tasks", "0001_initial"),
    ]

    operations = [
        migrations.AddField(
            model_name="taskrecord",
            name="token",
            field=models.BigIntegerField(
                db_default=0,
                default=0,
                editable=False,
                help_text="The fencing token of the job's last start: fresh on every start, "
                "shared by the jobs one statement started.",
            ),
        ),
        migrations.AlterField(
            model_name="taskrecord",
            name="attempt",
            field=models.PositiveIntegerField(
                default=0, editable=False, help_text="Attempts started so far."
            ),
        ),
    ]

from django.db import migrations, models

from django_outbox.operations import PublishTrigger


class Migration(migrations.Migration):
    dependencies = [
        ("testapp", "0002_job_effect"),
        ("django_outbox", "0001_initial"),
    ]

    operations = [
        migrations.CreateModel(
            name="Purchase",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("customer", models.CharField(max_length=100)),
                ("amount", models.DecimalField(decimal_places=2, max_digits=10)),
                ("note", models.CharField(blank=True, max_length=100)),
            ],
        ),
        # --8<-- [start:trigger]
        PublishTrigger(
            "purchase",
            stream="audit",
            fields=["id", "customer", "amount"],
            on=["insert", "update", "delete"],  # default: ["insert"]
        ),
        # --8<-- [end:trigger]
    ]

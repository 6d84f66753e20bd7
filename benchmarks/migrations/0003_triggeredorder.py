from django.db import migrations, models

from django_outbox.operations import PublishTrigger


class Migration(migrations.Migration):
    dependencies = [
        ("benchmarks", "0002_benchjob"),
        ("django_outbox", "0001_initial"),
    ]

    operations = [
        migrations.CreateModel(
            name="TriggeredOrder",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("customer", models.CharField(max_length=100)),
                ("amount", models.DecimalField(decimal_places=2, max_digits=10)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
            ],
        ),
        PublishTrigger("triggeredorder", stream="bench", fields=["id", "amount"]),
    ]

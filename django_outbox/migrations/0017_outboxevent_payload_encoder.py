import django.core.serializers.json
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_outbox", "0016_stream_rate_budget"),
    ]

    operations = [
        migrations.AlterField(
            model_name="outboxevent",
            name="payload",
            field=models.JSONField(encoder=django.core.serializers.json.DjangoJSONEncoder),
        ),
    ]

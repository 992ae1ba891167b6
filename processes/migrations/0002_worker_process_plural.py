# Issue 31.6: "Worker processs" on the admin index. Meta only: no SQL.
from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('processes', '0001_process_registry'),
    ]

    operations = [
        migrations.AlterModelOptions(
            name='workerprocess',
            options={'ordering': ['-heartbeat_at'], 'verbose_name_plural': 'worker processes'},
        ),
    ]

# Issue 31.6: an operator suppresses an address by hand (reason "manual", who in
# suppressed_by). Expand only (I23): a new column with a database default, so the previous
# release's inserts, which do not name it, keep working; the new choice changes no SQL.
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('notifications', '0009_delivery_feedback_event_key'),
    ]

    operations = [
        migrations.AddField(
            model_name='suppression',
            name='suppressed_by',
            field=models.CharField(blank=True, db_default='', default='', help_text='The operator who suppressed it by hand (empty: a report did).', max_length=150),
        ),
        migrations.AlterField(
            model_name='suppression',
            name='reason',
            field=models.CharField(choices=[('hard_bounce', 'Hard bounce'), ('complaint', 'Complaint'), ('soft_bounces', 'Three soft bounces in 7 days'), ('manual', 'Suppressed by an operator')], max_length=20),
        ),
    ]

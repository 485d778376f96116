from django.db import migrations

# Rate-limit windows shared by every worker and instance (billing/ratelimit.py). UNLOGGED: the
# counters are worth a crash's loss (a restart forgets the current window) and skip the WAL.
CREATE = """
CREATE UNLOGGED TABLE billing_rate_limit_window (
    bucket varchar(200) NOT NULL,
    window_index bigint NOT NULL,
    count integer NOT NULL,
    PRIMARY KEY (bucket, window_index)
)
"""


class Migration(migrations.Migration):
    dependencies = [
        ("billing", "0005_spend_buckets"),
    ]

    operations = [
        migrations.RunSQL(CREATE, "DROP TABLE billing_rate_limit_window"),
    ]

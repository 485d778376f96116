"""The permit reservation as a database function, ``permits_reserve``: the one copy of the rule.

A reservation takes ``p_amount`` credits and one call from the permit's
allowance in one conditional UPDATE: only while the permit is active and
unexpired and the allowance (credits and calls) covers it, so concurrent
reservations can never spend past ``max_credits``. Returns whether it did.
``permits.services.permit_reserve`` and the governed call's claim
(``gateway_claim``) both call it.
"""

from django.db import migrations

RESERVE = r"""
CREATE OR REPLACE FUNCTION permits_reserve(p_permit_id text, p_amount numeric, p_now timestamptz)
RETURNS boolean
LANGUAGE sql AS $$
    WITH reserved AS (
        UPDATE permits_permit SET spent_credits = spent_credits + p_amount, calls_used = calls_used + 1
         WHERE permit_id = p_permit_id AND status = 'active' AND expires_at > p_now
           AND spent_credits <= max_credits - p_amount AND (max_calls IS NULL OR calls_used < max_calls)
        RETURNING 1
    )
    SELECT EXISTS (SELECT 1 FROM reserved);
$$;
"""


class Migration(migrations.Migration):
    dependencies = [("permits", "0003_console_permissions")]

    operations = [
        migrations.RunSQL(RESERVE, reverse_sql="DROP FUNCTION IF EXISTS permits_reserve(text, numeric, timestamptz);"),
    ]

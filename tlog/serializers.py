"""Request records of the transparency log's endpoints (the answers are C2SP text and bytes)."""

from __future__ import annotations

from rest_framework import serializers

# Tree sizes are below 2**63 (tlog-checkpoint).
_MAX_SIZE = (1 << 63) - 1


class TlogConsistencyQuery(serializers.Serializer):
    """The two tree sizes of a consistency proof."""

    old = serializers.IntegerField(min_value=1, max_value=_MAX_SIZE, help_text="The older tree size (at least 1).")
    new = serializers.IntegerField(
        min_value=1, max_value=_MAX_SIZE, help_text="The newer tree size (at most the log's size)."
    )

"""Date and number formats for the console and pages (``FORMAT_MODULE_PATH``): times to the second
with their zone, so that calls in one minute can be told apart (docs/decisions.md, Operator console)."""

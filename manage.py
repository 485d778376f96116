#!/usr/bin/env python
"""Django's command-line utility for administrative tasks."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    if not os.environ.get("DATABASE_URL"):
        # The settings never start PostgreSQL (docs/decisions.md, Foundation): with no DATABASE_URL
        # the embedded server is started here (or found running) before any command runs.
        from devtools import pg

        pg.ensure_running()
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()

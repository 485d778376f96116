"""Root pytest configuration: mark the process as a test run before settings load."""

import os

os.environ.setdefault("TOLLGATE_TESTING", "1")

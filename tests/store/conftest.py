"""Fixtures for the store tests; the helpers live in store_support.py (see tests/tui/conftest.py)."""

from store_support import root, ws  # noqa: F401  (fixtures)

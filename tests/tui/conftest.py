"""Fixtures for the UI tests; the helpers live in tui_support.py, which test modules import by
that unique name (a bare `from conftest import` resolves to whichever conftest was imported first
when several test directories are collected together)."""

from tui_support import frozen_store_clock, workspace  # noqa: F401  (fixtures)

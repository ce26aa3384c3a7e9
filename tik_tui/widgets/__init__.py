"""Widgets of the TIK terminal UI; each takes plain store dicts or a `model.Snapshot`."""

"""Screens of the TIK terminal UI: the main tabs, a derivation's detail, the compare view, dialogs."""

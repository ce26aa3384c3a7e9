"""The `tik` command line. `main.py` dispatches; each sibling module registers a group of subcommands."""

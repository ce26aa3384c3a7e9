"""TIK's application: the `tik` command line, the agent (search loop + proposers), the worker and the Textual UI."""

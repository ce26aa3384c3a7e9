"""Root implementation files, one per operator. Each defines its entry point(s), may declare TUNABLES/CONFIG."""

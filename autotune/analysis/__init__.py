"""Reading a finished or running study: per-trial rows and what drives the objective (importance)."""

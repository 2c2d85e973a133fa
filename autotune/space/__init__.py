"""The search space: YAML specs checked against the installed vLLM's engine arguments, the
constraints a config must keep, and the spaces bundled with the package."""

"""One isolated trial: its spec and record, the worker process (the only code that imports vLLM),
the runner that starts and kills it, the line protocol between them, and how its end is classified."""

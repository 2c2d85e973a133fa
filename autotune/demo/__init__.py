"""The demo's tiny random-weight Llama, built locally (imports torch and transformers)."""

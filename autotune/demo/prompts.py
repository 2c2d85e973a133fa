"""Real prompts for ``autotune demo --real``: everyday requests of the kind a batch job sends."""

from __future__ import annotations

import json
from pathlib import Path

PROMPTS = (
    "The capital of France is",
    "Write a haiku about the sea.",
    "Explain photosynthesis in one sentence.",
    "List three prime numbers:",
    "def fibonacci(n):",
    "Once upon a time,",
    "The best way to learn a language is",
    "Q: What is 17*3? A:",
    "Summarise the plot of Hamlet.",
    "Translate 'good morning' into Spanish.",
    "Why is the sky blue?",
    "Give me a recipe for pancakes.",
    "What is the boiling point of water?",
    "Name the planets of the solar system.",
    "How do vaccines work?",
    "Write a limerick about a cat.",
    "What are the health benefits of green tea?",
    "Describe a sunset over the mountains.",
    "How does a bicycle stay upright?",
    "Write a short thank-you note to a teacher.",
    "What causes the seasons on Earth?",
    "Give three tips for a job interview.",
    "Explain what a database index is.",
    "Why do cats purr?",
    "Write the opening line of a mystery novel.",
    "How do I boil an egg?",
    "What is the difference between weather and climate?",
    "Suggest a name for a bakery.",
    "Explain recursion to a child.",
    "What is the tallest mountain in Africa?",
    "Write a tweet announcing a new coffee shop.",
    "How do plants drink water?",
)


def write_prompts(path: str | Path, count: int = 256, output_len: int = 32) -> Path:
    """A JSONL workload of ``count`` requests cycling through :data:`PROMPTS` (each numbered, so
    no two are the same prompt)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(count):
        prompt = PROMPTS[i % len(PROMPTS)] if i < len(PROMPTS) else f"{PROMPTS[i % len(PROMPTS)]} ({i})"
        lines.append(json.dumps({"prompt": prompt, "output_len": output_len}))
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out

"""Repeatable benchmarks around the tuner: configs side by side, with a roofline (see README.md)."""

"""The study: create or resume it on its storage, its settings, budget, lock, and the recovery of
trials cut off by a dead worker."""

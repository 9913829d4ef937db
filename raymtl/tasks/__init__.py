"""Tasks: what a client learns (targets, loss, optimiser, metrics)."""

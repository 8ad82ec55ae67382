"""Utilities of the trainer: dataset, checkpoints, run directory, tracking, plots, logging, memory estimate."""

"""Runnable examples of the trainer."""

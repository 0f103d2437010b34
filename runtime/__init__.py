"""Executors and the real training workers."""

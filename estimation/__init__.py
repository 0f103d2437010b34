"""Performance and memory models, profilers and fitting."""

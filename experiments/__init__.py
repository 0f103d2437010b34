"""Traces, simulator, baselines, comparison harness and benchmarks."""

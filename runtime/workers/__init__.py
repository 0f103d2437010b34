"""The real training workers: torch strategies, pipeline, JAX, DeepSpeed, spilling."""

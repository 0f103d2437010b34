"""Executors: decisions become running worker groups (local, Slurm, Ray, Kubernetes)."""

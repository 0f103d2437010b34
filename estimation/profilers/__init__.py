"""Profilers: real torch and JAX runs that measure layers, stages and collectives."""

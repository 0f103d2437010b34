"""Benchmarks run by `apportion bench`."""

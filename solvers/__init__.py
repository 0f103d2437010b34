"""Solver backends (CP-SAT, HiGHS, cvxpy), budgets, greedy fallbacks and the validator."""

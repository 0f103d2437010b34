"""Performance and memory models: analytic, Crius's cells, Morphling's fit, measured tables."""

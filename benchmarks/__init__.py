"""Measurements too slow or too noisy for the test suite: see benchmarks/README.md and BENCHMARKS.md."""

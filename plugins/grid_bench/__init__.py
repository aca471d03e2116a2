"""Benchmarks: grid bench plan / tick."""

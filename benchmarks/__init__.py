"""Benchmark suite: ``python -m benchmarks.run [--quick]`` writes benchmarks/RESULTS.md and plots."""

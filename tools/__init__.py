"""Quire tools: per-role launchers, standalone mode, console, recovery, scans, benchmarks."""

__version__ = "0.1.0"

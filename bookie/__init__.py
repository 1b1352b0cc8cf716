"""Quire bookie package."""

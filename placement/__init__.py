"""Quire placement package."""

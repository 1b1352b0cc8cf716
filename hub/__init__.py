"""Quire hub package."""

"""Metastore backends (each registered under the quire.metastore entry-point group)."""

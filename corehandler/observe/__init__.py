"""Observers of the daemon: journald records and Prometheus metrics."""

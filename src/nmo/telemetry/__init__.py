"""Metrics and structured logs: what every layer records, importing nothing of nmo."""

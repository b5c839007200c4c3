"""Admission: the validating webhook's rules and what they read.

``validators`` (the rules as plain functions, behavior.md A6), ``review``
(AdmissionReview v1 parsed at the edge and answered in its exact shape) and
``lookups`` (the cluster knowledge the rules need, cached and budgeted). The
HTTP server that carries them is :mod:`nmo.server`. Nothing here imports the
controller runtime or kr8s (import-linter); importing this package imports
nothing else.
"""

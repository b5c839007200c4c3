"""The maintenance rules, pure: what a pass observes, decides and plans.

Nothing here does I/O or touches the event loop (import-linter enforces it):
``observed`` (the plain data of a pass), ``planner`` (observed -> plan),
``transitions`` (status changes), ``node`` (node patches and prior state),
``pods`` (which pods a drain evicts), ``drainstate`` (per-pod drain
progress), ``lease`` (the medik8s lease rules). The runtime that observes
and applies lives one level up, in :mod:`nmo.core`.
"""

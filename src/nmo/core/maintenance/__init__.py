"""The maintenance rules, pure: what a pass observes, decides and plans.

Nothing here does I/O, reads the clock or touches the event loop
(import-linter and tests/unit/test_layout.py enforce it): ``observed`` (the
plain data of a pass), ``planner`` (observed -> plan), ``policy`` (the
operator's settings, when a status is written, the heartbeat),
``queueing`` (the fleet budget's queue), ``admission`` (the budget and window
rules), ``quorum`` (the etcd-quorum rule), ``transitions`` (status changes),
``nodepatch`` (node patches and the prior state), ``podselect`` and
``selectors`` (which pods a drain evicts), ``drainplan`` and ``drainstate``
(order, deadline, per-pod progress), ``disruption`` (PodDisruptionBudget
coverage), ``pdbgate`` (no retries behind a PDB that stands), ``lease`` (the
medik8s lease rules), ``notifications``. The runtime that observes and
applies is :mod:`nmo.controller`.
"""

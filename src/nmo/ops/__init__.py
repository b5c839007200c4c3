"""Operations toolkit: must-gather, emergency cleanup and a status view.

These are the guide's sections 3-6 (logs, events, must-gather, manual
cleanup) turned into commands (``nmo gather``, ``nmo cleanup``,
``nmo status``). Each module keeps its decisions in pure functions and talks
to the API only through :class:`nmo.kube.client.Kube`; the CLI glue is in
:mod:`nmo.cli.toolkit`.
"""

"""The maintenance rules, pure: :mod:`nmo.core.maintenance`.

No I/O, no clock, no event loop (import-linter): everything here is a
function of its arguments and is tested by tables.
"""

"""Shared by every test directory: its presence puts ``tests/`` on ``sys.path``.

pytest imports a conftest outside any package with its directory prepended to
``sys.path`` (the ``prepend`` import mode, as for each test directory's own
modules), so ``import builders`` (tests/builders.py) works from tests/unit,
tests/integration and tests/e2e alike.
"""

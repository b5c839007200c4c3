"""The ``nmo`` command: run, gather, cleanup, status, plan, crd and version.

The sandbox and the demo are development tooling: ``nmo-sandbox`` (the
``nmo-sandbox`` distribution in ``sandbox/``), never part of the image.

A command imports only what it uses (issue 21 item 6): :func:`main` parses
with :mod:`nmo.cli.flags` (the standard library and nmo's constants) and
loads a command's modules when it runs it, so ``nmo version`` and ``nmo
--help`` load no client, server or model library. The modules, one purpose
each:

* :mod:`nmo.cli.flags`: every flag, its default and its help;
* :mod:`nmo.cli.settings`: ``nmo run``'s flags as settings;
* :mod:`nmo.cli.runner`: ``nmo run``, wiring the operator from its settings
  and handing it to the process supervisor
  (:class:`nmo.controller.manager.Manager`);
* :mod:`nmo.cli.toolkit`: ``gather``, ``cleanup``, ``status`` and ``plan``;
* :mod:`nmo.cli.plugin`: ``kubectl nm``; :mod:`nmo.cli.gomanager`: the Go
  NMO's ``/manager`` entry point; :mod:`nmo.cli.goflags` and
  :mod:`nmo.cli.defaults`: the Go NMO's flags and defaults.

The names this package always offered (``build_parser``, ``settings_from``,
``run``, ...) are still its attributes, loaded from their modules on first use.
"""

from __future__ import annotations

import sys
from typing import Any

# name -> the module that defines it, imported on first use (PEP 562)
_LAZY = {
    "build_parser": "nmo.cli.flags",
    "command_line": "nmo.cli.flags",
    "Connection": "nmo.cli.settings",
    "Settings": "nmo.cli.settings",
    "budget_settings": "nmo.cli.settings",
    "notify_settings": "nmo.cli.settings",
    "server_settings": "nmo.cli.settings",
    "settings_from": "nmo.cli.settings",
    "run": "nmo.cli.runner",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


def main(argv: list[str] | None = None) -> int:
    from nmo.cli import goflags
    from nmo.cli.flags import build_parser, command_line, run_error

    try:
        argv = command_line(list(sys.argv[1:] if argv is None else argv))
    except goflags.GoFlagError as exc:
        return run_error(str(exc))
    args = build_parser().parse_args(argv)
    if args.command == "version":
        from nmo import __version__

        print(f"nmo {__version__}")
        return 0
    if args.command == "crd":
        import yaml

        from nmo.api.crd import crd

        print(yaml.safe_dump(crd(), sort_keys=False), end="")
        return 0
    if args.command == "run":
        from nmo.cli import runner

        return runner.command(args)
    if args.command in ("gather", "cleanup", "status", "plan"):
        from nmo.cli import toolkit

        return toolkit.main(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())

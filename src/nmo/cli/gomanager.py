"""``/manager``: the Go NMO's entry point, in nmo's image.

The Go NMO's Deployment and CSV run ``command: [/manager]`` with Go flags
(``--health-probe-bind-address=:8081 --metrics-bind-address=:8443
--leader-elect --enable-http2=false``). The image installs this module's
:func:`main` as ``/manager`` so that such a pod runs ``nmo run`` with those
arguments unchanged; :mod:`nmo.cli.goflags` reads them as Go does.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """``nmo run`` with ``argv`` (default: this process's arguments)."""
    from nmo import cli

    return cli.main(["run", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())

"""Check that the locked environment holds what setup.py asks for: `python scripts/check_lock.py LOCK`.

`make install` installs requirements/lock.txt with --no-deps, so a requirement added to setup.py without
`make lock` would simply be missing. This reads the installed package's own requirements (install_requires
and the extras the lock is made with) and exits 2 naming each one that is absent or at a version it does not
allow, and what to run.
"""

from __future__ import annotations

import sys
from importlib import metadata

from packaging.requirements import Requirement

PACKAGE = "search-r1-trainer"
LOCKED_EXTRAS = ("cpu", "dev", "trackers", "wiki")  # the extras `make lock` installs (cpu: by hand, see the Makefile)


def unmet_requirements(package: str = PACKAGE, extras: tuple[str, ...] = LOCKED_EXTRAS) -> list[str]:
    """Requirements of ``package`` (with ``extras``) that the environment does not satisfy, as messages."""
    unmet = []
    for line in metadata.requires(package) or []:
        req = Requirement(line)
        if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in ("", *extras)):
            continue
        try:
            version = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            unmet.append(f"{req} (not installed)")
            continue
        if req.specifier and not req.specifier.contains(version, prereleases=True):
            unmet.append(f"{req} (locked: {version})")
    return unmet


def main(argv: list[str]) -> int:
    lock = argv[1] if len(argv) > 1 else "requirements/lock.txt"
    unmet = unmet_requirements()
    if unmet:
        print(f"[install] error: setup.py asks for what {lock} does not hold:\n  " + "\n  ".join(unmet)
              + "\n  Run `make lock` to resolve and rewrite the lock, then `make install`.", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))

"""The nightly Ray job: `ray job submit --working-dir . -- python jobs/backfill.py ...`.

Same stages and flags as `tkg build`; on a cluster set `ray.address: auto` in the config
(or leave it null under `ray job submit`, which exports RAY_ADDRESS to the driver).
"""

from __future__ import annotations

import sys

from tkg.jobs.cli import main


def run(argv: list[str]) -> int:
    return main(["build", *argv])


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))

"""tkg: bi-temporal knowledge graphs for agent memory, built in batch on Ray.

One namespace, three layers whose folders sit at the top of the repository (mapped in
pyproject.toml): `tkg.pipeline` (build and publish), `tkg.query` (retrieval over a published
snapshot) and `tkg.jobs` (command line, benchmarks). Imports point one way only:
jobs -> query -> pipeline (tests/test_architecture.py walks them).
"""

import os
import sys

__version__ = "0.1.0"

# Arrow's allocator, named before pyarrow is first imported (its default pool is made at
# import, from this variable): jemalloc gives freed pages back to the system within a
# second, where the default, mimalloc, kept them for reuse. A 200-episode night into the
# 160,000-episode synthetic store peaked at 999-1,010 MB of driver RSS with jemalloc and at
# 1,246-1,467 MB without, in the same time; into 10,000, at 586-596 MB against 714-796
# (`tkg bench incremental`, the same stores, 2026-11-27). Setting `pa.set_memory_pool` after
# import kept the peaks. A local Ray's workers inherit it; a pool the user named wins.
if sys.platform.startswith("linux"):  # (the Linux wheels ship jemalloc)
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "jemalloc")

# Run from a checkout without an install (`ray job submit --working-dir .` where the head's
# `python` is not the venv's, or an image that installed tkg elsewhere): the working dir's
# `tkg/` is found first, and its layers are the folders beside it. Installed, `tkg/` has no
# such siblings (pyproject.toml maps them) and nothing changes.
def _checkout_layers() -> None:
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    if (root / "pyproject.toml").is_file() and all(
            (root / layer / "__init__.py").is_file() for layer in ("pipeline", "query", "jobs")):
        __path__.append(str(root))  # tkg.jobs -> ROOT/jobs, tkg.query -> ROOT/query, ...


_checkout_layers()

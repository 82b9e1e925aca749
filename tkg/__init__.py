"""tkg: bi-temporal knowledge graphs for agent memory, built in batch on Ray.

One namespace, three layers whose folders sit at the top of the repository (mapped in
pyproject.toml): `tkg.pipeline` (build and publish), `tkg.query` (retrieval over a published
snapshot) and `tkg.jobs` (command line, benchmarks). Imports point one way only:
jobs -> query -> pipeline (tests/test_architecture.py walks them).
"""

__version__ = "0.1.0"

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

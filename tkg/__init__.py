"""tkg: bi-temporal knowledge graphs for agent memory, built in batch on Ray.

One namespace, three layers whose folders sit at the top of the repository (mapped in
pyproject.toml): `tkg.pipeline` (build and publish), `tkg.query` (retrieval over a published
snapshot) and `tkg.jobs` (command line, benchmarks). Imports point one way only:
jobs -> query -> pipeline (tests/test_architecture.py walks them).
"""

__version__ = "0.1.0"

"""One tiny `tkg bench graph` run (LoCoMo's first session and the chinook records, built into
one store, each in groups of its own), shared by tests/test_bench_graph.py, which checks its
figures, and tests/test_records_chinook.py, which checks the chinook group of its store. Each
built the chinook records before (11.3 s of fixture setup and a 14.7 s bench in the last full
run); the first of the two to run builds, the other reuses it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.conftest import SHARED_DATA

LOCOMO = SHARED_DATA / "locomo10.json"
CHINOOK = SHARED_DATA / "chinook_fixture.json"
_RUN: dict[str, dict[str, Any]] = {}  # the one run of this test session


def tiny_graph(config: Any, tmp_path_factory: Any) -> dict[str, Any]:
    """The figures of `bench_graph` over one LoCoMo session and the chinook records (chinook
    alone where ../shared/data has no LoCoMo), run once per session; figures["store"] is its
    store."""
    from tkg.jobs.bench.graph import bench_graph

    if "figures" not in _RUN:
        parts = ("locomo", "chinook") if LOCOMO.is_file() else ("chinook",)
        workdir: Path = tmp_path_factory.mktemp("graph")
        _RUN["figures"] = bench_graph(parts, SHARED_DATA, config=config, workdir=str(workdir),
                                      conversations=1, sessions=1)
    return _RUN["figures"]

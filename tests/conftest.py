"""Shared fixtures: one local Ray session for every test that needs Ray, and the sample
corpus built once per session."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from tests.s3 import use_test_credentials

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
use_test_credentials()  # before any Ray worker starts, so workers inherit them
# Property tests judge outcomes, never speed: no per-example deadline and no health check
# that fails a slow (shared, loaded) machine for generating examples slowly.
settings.register_profile("tkg", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("tkg")

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "corpus"
# ../shared/data beside the checkout; TKG_SHARED_DATA names it for a checkout elsewhere (a
# git worktree).
SHARED_DATA = Path(os.environ.get("TKG_SHARED_DATA") or ROOT.parent / "shared" / "data")


@pytest.fixture(scope="session")
def config():
    """The embedded default, sized for tiny test inputs on 2 cores: one actor per model
    (actor start-up, not compute, dominates there) and two shuffle partitions."""
    from tkg.pipeline.config import load_config

    base = load_config(ROOT / "configs" / "local.yaml")
    return base.model_copy(update={
        "extract": base.extract.model_copy(update={"actors": 1}),
        "embed": base.embed.model_copy(update={"actors": 1, "threads_per_actor": 2}),
        "ray": base.ray.model_copy(update={"shuffle_partitions": 2, "progress_bars": False,
                                           "object_store_gb": 2}),
    })


@pytest.fixture(scope="session")
def ray_session(config):
    """One local Ray for the whole test session (starting Ray costs seconds)."""
    import ray
    from tkg.pipeline.build import init_ray

    init_ray(config.model_copy(update={"ray": config.ray.model_copy(update={"num_cpus": 2})}))
    yield
    ray.shutdown()


@pytest.fixture(scope="session")
def s3():
    """A real S3-compatible server (moto) on loopback with one bucket (tests/s3.py)."""
    from tests.s3 import s3_server

    with s3_server() as server:
        yield server


@pytest.fixture(scope="session")
def s3_config(config, s3):
    """The test config with its `storage` section pointing at the S3 server."""
    return config.model_copy(update={"storage": config.storage.model_validate(s3.storage())})


@pytest.fixture(scope="session")
def cluster_chain(s3, s3_config, tmp_path_factory):
    """The nightly job on a multi-node Ray cluster of its own, store on the S3 server: killed
    mid-extraction, resumed, then an incremental run (tests/cluster_build.py); shared by the
    cluster and object-storage tests."""
    from tests.cluster_build import run_chain

    return run_chain(s3, s3_config, tmp_path_factory.mktemp("cluster"))


@pytest.fixture(scope="session")
def expected() -> dict:
    return json.loads((CORPUS / "expected.json").read_text())


@pytest.fixture(scope="session")
def corpus_cli_build(ray_session, config, tmp_path_factory):
    """The sample corpus built into a fresh store by `tkg build` as `make demo` runs it (not
    verbose, on the session's Ray), with what it printed on the terminal."""
    import yaml
    from tkg.jobs.cli import main
    from tkg.pipeline import store as stores
    from tkg.pipeline.build import BuildResult

    folder = tmp_path_factory.mktemp("corpus")
    config_file = folder / "config.yaml"
    config_file.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    printed = folder / "terminal.txt"
    with printed.open("w", buffering=1) as terminal:
        code = _with_terminal(terminal, lambda: main([
            "build", "--config", str(config_file), "--input", str(CORPUS),
            "--store", str(folder / "store"), "--run-id", "corpus-1"]))
    assert code == 0, printed.read_text()
    snapshot = stores.current_snapshot(folder / "store")
    summary = stores.read_manifest(snapshot)["summary"]
    return BuildResult(summary=summary, snapshot=snapshot), printed.read_text()


def _with_terminal(terminal, call):
    """Run `call` with fd 1 and Python's stdout on `terminal` (tkg build writes its stage lines
    to a copy of fd 1 and its summary to sys.stdout)."""
    import contextlib
    import sys

    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(terminal.fileno(), 1)
    try:
        with contextlib.redirect_stdout(terminal):
            return call()
    finally:
        os.dup2(saved, 1)
        os.close(saved)


@pytest.fixture(scope="session")
def corpus_build(corpus_cli_build):
    """The sample corpus built into a fresh store."""
    return corpus_cli_build[0]


@pytest.fixture(scope="session")
def corpus_db(corpus_build):
    from tkg.pipeline.store import open_catalog

    with open_catalog(corpus_build.snapshot) as con:
        yield con


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip("../shared/data is absent")
    return SHARED_DATA

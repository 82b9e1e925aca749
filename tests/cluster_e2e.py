"""Off one machine, end to end (run explicitly: `pytest tests/cluster_e2e.py`; not collected by
the suite yet): the nightly job submitted through the Ray Jobs API to a head of its own, and a
build on a multi-node `ray.cluster_utils.Cluster`, inputs and store on the S3 server.
Loopback only (tests/ray_head.py: LOOPBACK); the suite's local Ray session is not touched."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from tkg.pipeline import storage, store

from tests.conftest import CORPUS, ROOT
from tests.ray_head import LOOPBACK, WARM_WORKERS, ray_head

pytestmark = pytest.mark.timeout(2400)
ID_COLUMNS = {"episodes": "episode_id", "entities": "entity_id", "facts": "edge_id",
              "mentions": "episode_id"}


@pytest.fixture(scope="module")
def s3_corpus(s3, s3_config) -> str:
    """The sample corpus uploaded to the S3 server."""
    url = s3.url("inputs", "corpus")
    for path in sorted(CORPUS.glob("*.jsonl")):
        storage.write_bytes(f"{url}/{path.name}", path.read_bytes(), s3_config.storage)
    return url


def write_config(config, path: Path) -> Path:
    """The test config as YAML with `ray.address: null`, as the README's submit uses it."""
    data = config.model_dump(mode="json")
    data["ray"]["address"] = None
    path.write_text(yaml.safe_dump(data))
    return path


def published_ids(snapshot: Path | str) -> dict[str, list]:
    """Rows of every published table and the sorted ids of the keyed ones."""
    with store.open_catalog(snapshot) as con:
        return {table: sorted(map(tuple, con.execute(
                    f"SELECT {column}, count(*) FROM {table} GROUP BY ALL").fetchall()))
                for table, column in ID_COLUMNS.items()}


def test_ray_job_submit(s3, s3_config, s3_corpus, corpus_build, tmp_path):
    """`ray job submit ... -- python -m tkg.jobs.backfill` with token auth and `ray.address:
    null` succeeds and publishes the same graph as the single-node build."""
    inputs = s3_corpus
    config_file = write_config(s3_config, tmp_path / "job.yaml")
    store_dir = s3.url()
    with ray_head(num_cpus=2) as head:
        done = head.run("job", "submit", "--address", head.dashboard, "--working-dir", str(ROOT),
                        "--submission-id", "tkg-nightly-1", "--",
                        "python", "-m", "tkg.jobs.backfill", "--config", str(config_file),
                        "--input", inputs, "--store", str(store_dir), "--run-id", "job-1",
                        "--json", cwd=ROOT)
        status = head.run("job", "status", "--address", head.dashboard, "tkg-nightly-1")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "SUCCEEDED" in status.stdout + status.stderr
    assert store.current_run(store_dir) == "job-1"
    manifest = store.read_manifest(store.current_snapshot(store_dir))
    assert all(f.startswith(inputs) for f in manifest["inputs"])
    assert manifest["summary"]["episodes"] == json.loads(
        (CORPUS / "expected.json").read_text())["episodes_total"]
    assert published_ids(store.current_snapshot(store_dir)) == published_ids(
        corpus_build.snapshot)


def test_multi_node_build_resumes(s3, s3_config, s3_corpus, corpus_build, tmp_path):
    """A CPU-less head and two worker nodes (tests/cluster_build.py, its own process): the
    driver dies in extraction, a worker node is killed and replaced, the same run id resumes
    and publishes the graph of the single-node build."""
    config = s3_config.model_copy(update={
        "extract": s3_config.extract.model_copy(update={"chunk_rows": 64})})
    config_file = write_config(config, tmp_path / "cluster.yaml")
    store_dir = s3.url()
    temp = tempfile.mkdtemp(prefix="tkgc-", dir="/tmp")
    env = {**os.environ, **WARM_WORKERS, **LOOPBACK, "RAY_TMPDIR": temp}
    env.pop("RAY_ADDRESS", None)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "tests.cluster_build", "--config", str(config_file),
             "--input", s3_corpus, "--store", store_dir, "--run-id", "multi-1",
             "--crash-at-chunk", "1"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["nodes"] == 3 and report["crashed"]
    chunks = storage.list_dirs(storage.join(store.work_dir(store_dir, "multi-1"), "extract",
                                            "_chunks"))
    assert len(chunks) > 1
    assert published_ids(store.current_snapshot(store_dir)) == published_ids(
        corpus_build.snapshot)


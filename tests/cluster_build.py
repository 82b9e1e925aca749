"""The nightly job on a multi-node Ray cluster, inputs and store on the S3 server: the one chain
of builds that tests/test_cluster.py and tests/test_s3_build.py check.

`run_chain` (the session fixture `cluster_chain`) uploads the sample corpus plus hostile records
and starts `python -m tests.cluster_build` in a child process, so that the cluster never meets
the test session's local Ray. That process starts a CPU-less head (dashboard, Jobs API) and two
one-CPU worker nodes (tests/ray_head.py), all on 127.0.0.1 with token authentication, and runs
the README's nightly command with `ray job submit --working-dir <repository> -- python -m
tkg.jobs.backfill` three times:

1. `ray.address: null`, the driver path off (every shuffle, join, map and model on Ray Data),
   TKG_FAULT set: the driver dies when extraction (on the worker nodes' actors) reaches
   chunk 1, chunk 0 kept; then worker node 0 is killed (its raylet, object store, workers)
   and a fresh node joins;
2. the same command and run id without the fault: resumes and publishes; where its tasks and
   actors ran is read from Ray's state API (`placement`);
3. `ray.address: auto`, one later episode: an incremental run into the same store.

It writes a JSON report (job statuses and logs, the work dir after the crash, seconds, nodes).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUN, LATER_RUN = "cluster-1", "cluster-2"
LATE = {"group_id": "acme", "kind": "message", "conversation_id": "late", "id": "late-1",
        "speaker": "Alice Chen", "timestamp": "2025-06-01T09:00:00Z",
        "content": "Alice Chen moved to Lisbon."}


@dataclass(frozen=True)
class ClusterChain:
    report: dict
    store: str  # s3://.../store
    inputs: str  # the corpus and the hostile records
    later_input: str


def write_config(config, address: str | None, path: Path, ray_data: bool = False) -> str:
    """The test config as YAML, as a job reads it, extraction in chunks of 120 episodes (two
    for the input). `ray_data`: the driver path off (ray.driver_rows and ray.driver_mb 0), so
    the models run on actor pools and every shuffle, join and map on Ray Data across the
    worker nodes, as a night too big for the driver does. Without it (job 3, one episode) the
    size policy keeps the night in the driver, as it would a small night on a cluster: actor
    pools there made the job 33.1 s against 25.0 s (paired standalone chain runs)."""
    import yaml

    data = config.model_dump(mode="json")
    data["ray"]["address"] = address
    if ray_data:
        data["ray"].update(driver_rows=0, driver_mb=0)
    data["extract"].update(chunk_rows=120, actors=2, batch_size=32)
    path.write_text(yaml.safe_dump(data))
    return str(path)


def run_chain(s3, s3_config, folder: Path) -> ClusterChain:
    """Upload the inputs, run the three jobs in a child process, return its report."""
    from tkg.pipeline import storage

    from tests.ray_head import cluster_env, temp_dir
    from tests.test_reliability import CORPUS, hostile_lines

    storage.configure(s3_config.storage)
    root = s3.url()
    for path in sorted(CORPUS.glob("*.jsonl")):
        storage.write_bytes(f"{root}/in/{path.name}", path.read_bytes())
    storage.write_bytes(f"{root}/in/hostile.jsonl", b"\n".join(hostile_lines()[0]) + b"\n")
    storage.write_text(f"{root}/late/late.jsonl", json.dumps(LATE) + "\n")
    chain = ClusterChain({}, f"{root}/store", f"{root}/in", f"{root}/late")
    report = folder / "report.json"
    with temp_dir() as temp:
        done = subprocess.run(
            [sys.executable, "-m", "tests.cluster_build",
             "--config-null", write_config(s3_config, None, folder / "null.yaml", ray_data=True),
             "--config-auto", write_config(s3_config, "auto", folder / "auto.yaml"),
             "--input", chain.inputs, "--later-input", chain.later_input,
             "--store", chain.store, "--report", str(report)],
            cwd=ROOT, env=cluster_env(temp), capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return ClusterChain(json.loads(report.read_text()), chain.store, chain.inputs,
                        chain.later_input)


def submit(dashboard: str, job_id: str, config: str, inputs: str, store: str, run_id: str,
           env_vars: dict[str, str] | None = None) -> dict:
    """`ray job submit` (the CLI, as the README writes it), waiting for the job's end."""
    from ray.job_submission import JobSubmissionClient

    from tests.ray_head import VENV_BIN

    env_vars = {"PYTHONFAULTHANDLER": "1", **(env_vars or {})}  # a crash's stack in the log
    command = [str(VENV_BIN / "ray"), "job", "submit", "--address", dashboard,
               "--submission-id", job_id, "--working-dir", str(ROOT),
               "--runtime-env-json", json.dumps({"env_vars": env_vars}),
               "--", "python", "-m", "tkg.jobs.backfill", "--config", config,
               "--input", inputs, "--store", store, "--run-id", run_id]
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=1200)
    client = JobSubmissionClient(dashboard)
    return {"returncode": done.returncode, "seconds": round(time.monotonic() - started, 1),
            "status": str(client.get_job_status(job_id).value),
            "log": client.get_job_logs(job_id)[-6000:],
            "cli": (done.stdout + done.stderr)[-2000:]}


def placement(dashboard: str, job_id: str, timeout: float = 60) -> dict:
    """Where a finished job's work ran, from Ray's state API: the name, type and node of each
    of its tasks and actors, and the head's node id. Workers report task events about once
    a second, so this waits (bounded) until the job's tasks are listed."""
    from ray.job_submission import JobSubmissionClient
    from ray.util.state import list_actors, list_nodes, list_tasks

    ray_job = JobSubmissionClient(dashboard).get_job_info(job_id).job_id
    deadline = time.monotonic() + timeout
    while True:
        tasks = list_tasks(address=dashboard, filters=[("job_id", "=", ray_job)],
                           limit=10_000, raise_on_missing_output=False)
        if tasks or time.monotonic() > deadline:
            break
        time.sleep(1)
    actors = list_actors(address=dashboard, filters=[("job_id", "=", ray_job)],
                         limit=10_000, raise_on_missing_output=False)
    return {"head": [n.node_id for n in list_nodes(address=dashboard) if n.is_head_node],
            "tasks": [{"name": t.name, "type": str(t.type), "node_id": t.node_id}
                      for t in tasks],
            "actors": [{"class_name": a.class_name, "node_id": a.node_id} for a in actors]}


def work_after_crash(store_dir: str) -> dict:
    """What the crashed run left: extraction chunks planned and finished, and CURRENT."""
    from tkg.pipeline import outputs, resume, storage, store

    chunks = storage.join(store.work_dir(store_dir, RUN), "extract", resume.CHUNKS)
    return {"planned": json.loads(storage.read_text(storage.join(chunks, resume.PLAN))),
            "finished": [storage.name(c) for c in storage.list_dirs(chunks)
                         if outputs.finished(c) is not None],
            "current": store.current_run(store_dir)}


def main(argv: list[str]) -> int:
    from tkg.pipeline import faults, storage
    from tkg.pipeline.config import load_config

    from tests.ray_head import loopback_cluster

    parser = argparse.ArgumentParser()
    parser.add_argument("--config-null", required=True, help="ray.address: null")
    parser.add_argument("--config-auto", required=True, help="ray.address: auto")
    parser.add_argument("--input", required=True)
    parser.add_argument("--later-input", required=True)
    parser.add_argument("--store", required=True)
    parser.add_argument("--report", required=True, help="where the JSON report goes")
    args = parser.parse_args(argv)
    storage.configure(load_config(args.config_null).storage)
    report: dict = {}
    started = time.monotonic()
    with loopback_cluster(workers=2) as cluster:
        report["start_seconds"] = round(time.monotonic() - started, 1)
        report["nodes"] = cluster.alive_nodes()
        nightly = (args.config_null, args.input, args.store, RUN)
        report["crashed"] = submit(cluster.dashboard, "tkg-crash", *nightly,
                                   {faults.ENV: "extract_batch:1"})
        report["after_crash"] = work_after_crash(args.store)
        started = time.monotonic()
        cluster.replace_worker(0)
        report["replace_seconds"] = round(time.monotonic() - started, 1)
        report["nodes_after"] = cluster.alive_nodes()
        report["resumed"] = submit(cluster.dashboard, "tkg-resume", *nightly)
        report["placement"] = placement(cluster.dashboard, "tkg-resume")
        report["auto"] = submit(cluster.dashboard, "tkg-auto", args.config_auto,
                                args.later_input, args.store, LATER_RUN)
    Path(args.report).write_text(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

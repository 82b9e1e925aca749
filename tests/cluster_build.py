"""A build on a multi-node Ray cluster, in a process of its own (`python -m
tests.cluster_build`), so that its ray.init never meets the test session's local Ray.

The cluster is `ray.cluster_utils.Cluster`: a head with no CPUs for tasks and two worker
nodes with their own resources, all on 127.0.0.1, under RAY_TMPDIR (set by the caller, so the
cluster's address file is not the machine's default one). With `--crash-at-chunk N` the driver
dies when extraction reaches chunk N, worker node 0 is removed (its processes killed) and a
fresh node joins, then the same run id resumes. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import ray
from ray.cluster_utils import Cluster
from tkg.pipeline import faults
from tkg.pipeline.build import build, init_ray
from tkg.pipeline.config import load_config

NODE = {"num_cpus": 1, "node_ip_address": "127.0.0.1", "object_store_memory": 300 * 2**20}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--store", required=True)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--crash-at-chunk", type=int, default=None)
    args = parser.parse_args(argv)
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "node_ip_address": "127.0.0.1", "include_dashboard": False})
    workers = [cluster.add_node(**NODE) for _ in range(2)]
    base = load_config(args.config)
    config = base.model_copy(update={"ray": base.ray.model_copy(
        update={"address": cluster.address})})
    report: dict = {"nodes": 0, "crashed": False}
    try:
        init_ray(config)
        report["nodes"] = len([n for n in ray.nodes() if n["Alive"]])
        if args.crash_at_chunk is not None:
            os.environ[faults.ENV] = f"extract_batch:{args.crash_at_chunk}"
            try:
                build(config, [args.input], args.store, run_id=args.run_id)
            except faults.InjectedCrash:
                report["crashed"] = True
            del os.environ[faults.ENV]
            cluster.remove_node(workers[0])
            cluster.add_node(**NODE)
        result = build(config, [args.input], args.store, run_id=args.run_id)
        report["summary"] = result.summary
    finally:
        ray.shutdown()
        cluster.shutdown()
    print(json.dumps(report, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

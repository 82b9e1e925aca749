"""A Ray cluster of its own for the cluster tests: `ray.cluster_utils.Cluster` with a head that
takes no tasks (its dashboard serves the Jobs API) and worker nodes with their own resources,
loopback only, its own ports, temp dir and token, stopped through the Cluster API (which kills
exactly the processes it started; never `ray stop`, which ends every Ray process of the
machine, the suite's session included).

Run it in a process of its own (tests/cluster_build.py): the Cluster writes its address file
and its nodes' global state into the process that creates it.
"""

from __future__ import annotations

import os
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.s3 import free_port

VENV_BIN = Path(sys.executable).parent
# A cluster's own warm worker pool, as the README advises for small jobs (Ray reads RAY_<name>
# system settings from every node's environment); without it each Ray Data operation starts
# Python workers again.
WARM_WORKERS = {"RAY_idle_worker_killing_time_threshold_ms": "300000",
                "RAY_num_workers_soft_limit": "10"}
# Ray 2.60's ray.init rewrites a loopback address (127.0.0.1:PORT) to the machine's routable
# IP before connecting (services.resolve_ip_for_localhost -> get_node_ip_address), where a
# node bound to 127.0.0.1 does not listen: the driver then retries the GCS forever. With this
# switch off, get_node_ip_address answers the loopback IP (ray_constants.ENABLE_RAY_CLUSTER),
# so every node, driver, job supervisor and `ray job` client stays on 127.0.0.1. Nodes added
# with the Cluster API are not refused by it (only `ray start --address` checks it).
LOOPBACK = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
# The GCS marks a killed worker node dead after `failure_threshold` failed health checks,
# `period_ms` apart (Ray's default: 5 x 3 s, 14.6 s of the chain's node replacement). A killed
# raylet refuses the connection at once, so 3 x 0.5 s finds it; a live one answers within
# the (default 10 s) timeout even on a loaded machine. Replacement: 1.2-3.2 s in three runs.
FAST_DEATH = {"RAY_health_check_period_ms": "500", "RAY_health_check_failure_threshold": "3"}
NODE = {"num_cpus": 1, "node_ip_address": "127.0.0.1", "object_store_memory": 200 * 2**20}


def node_args() -> dict:
    """A worker node's settings. Its runtime_env folder is its own, as on a machine of its
    own: nodes of one machine share the session dir, and with one shared folder a job's
    working_dir could be unpacked or deleted by another node's agent under a running driver
    (seen: a resumed job's driver lost its cwd)."""
    return {**NODE, "runtime_env_dir_name": f"runtime_resources_{secrets.token_hex(4)}"}


def cluster_env(temp: str) -> dict[str, str]:
    """The environment of the process that starts the cluster (every node inherits it):
    loopback, warm workers, token authentication with a token of its own (Ray 2.60 would
    otherwise write one under ~/.ray), its own temp dir and address file."""
    env = {**os.environ, **WARM_WORKERS, **LOOPBACK, **FAST_DEATH, "RAY_AUTH_MODE": "token",
           "RAY_AUTH_TOKEN": secrets.token_hex(32), "RAY_USAGE_STATS_ENABLED": "0",
           "RAY_TMPDIR": temp, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    for name in ("RAY_ADDRESS", "RAY_AUTH_TOKEN_PATH"):
        env.pop(name, None)
    return env


@dataclass
class LoopbackCluster:
    cluster: object  # ray.cluster_utils.Cluster
    workers: list  # ray._private.node.Node of the worker nodes, in order
    dashboard: str  # http://127.0.0.1:PORT, for `ray job submit --address`

    def replace_worker(self, index: int) -> None:
        """Kill worker node `index` (raylet, object store, its workers and actors: the
        processes this cluster started for it) and join a fresh one in its place."""
        self.cluster.remove_node(self.workers[index], allow_graceful=False)
        self.workers[index] = self.cluster.add_node(**node_args())
        self.cluster.wait_for_nodes(timeout=120)  # until the GCS has seen the old one die

    def alive_nodes(self) -> int:
        return len(self.cluster.global_state._live_node_ids())


@contextmanager
def loopback_cluster(workers: int = 2) -> Iterator[LoopbackCluster]:
    """A CPU-less head with the dashboard and `workers` one-CPU worker nodes, all on
    127.0.0.1, under RAY_TMPDIR (short: Unix socket paths stay under ~100 characters)."""
    from ray.cluster_utils import Cluster

    dashboard = free_port()
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "node_ip_address": "127.0.0.1", "gcs_server_port": free_port(),
        "dashboard_agent_listen_port": free_port(),  # not the default one another head has
        "include_dashboard": True, "dashboard_host": "127.0.0.1",
        "dashboard_port": dashboard, "object_store_memory": 100 * 2**20})
    try:
        nodes = [cluster.add_node(**node_args()) for _ in range(workers)]
        running = LoopbackCluster(cluster, nodes, f"http://127.0.0.1:{dashboard}")
        wait_for_jobs_api(running.dashboard)
        yield running
    finally:
        cluster.shutdown()


def wait_for_jobs_api(address: str, timeout: float = 180) -> None:
    """Until the dashboard answers the Jobs API (it starts after the GCS)."""
    from ray.job_submission import JobSubmissionClient

    deadline = time.monotonic() + timeout
    while True:
        try:
            JobSubmissionClient(address).list_jobs()
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


@contextmanager
def temp_dir() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="tkgc-", dir="/tmp")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)

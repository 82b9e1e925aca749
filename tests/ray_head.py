"""A Ray head of its own for the cluster tests: loopback only, its own ports and temp dir,
token authentication on (as Ray 2.60 expects), and stopped by its own process ids (never
`ray stop`, which ends every Ray process of the machine, the suite's session included)."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from tests.s3 import free_port

VENV_BIN = Path(sys.executable).parent
# A cluster's own warm worker pool, as the README advises for small jobs (Ray reads RAY_<name>
# system settings from every node's environment); without it each Ray Data operation starts
# Python workers again.
WARM_WORKERS = {"RAY_idle_worker_killing_time_threshold_ms": "300000",
                "RAY_num_workers_soft_limit": "10"}
# Ray 2.60's ray.init rewrites a loopback address (127.0.0.1:PORT) to the machine's routable
# IP before connecting (services.resolve_ip_for_localhost), where a node bound to 127.0.0.1
# does not listen: the driver then retries the GCS forever (the multi-node test's hang in
# Node._init_gcs_client). This switch, Ray's own for single-machine clusters, makes Ray take
# the loopback IP as the node's address, so every node, driver and job stays on 127.0.0.1.
LOOPBACK = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


@dataclass
class RayHead:
    gcs_address: str  # 127.0.0.1:PORT, for ray.init / worker nodes
    dashboard: str  # http://127.0.0.1:PORT, for `ray job submit --address`
    env: dict[str, str] = field(repr=False)  # what a client needs (token, PATH)

    def run(self, *args: str, cwd: Path | None = None, timeout: float = 1800
            ) -> subprocess.CompletedProcess:
        return subprocess.run([str(VENV_BIN / "ray"), *args], env=self.env, cwd=cwd,
                              capture_output=True, text=True, timeout=timeout)


def _stop(process: subprocess.Popen) -> None:
    """Terminate the `ray start --block` process and every process it started, by pid."""
    try:
        family = [psutil.Process(process.pid), *psutil.Process(process.pid).children(True)]
    except psutil.NoSuchProcess:
        return
    for proc in family:
        with suppress(psutil.NoSuchProcess):
            proc.terminate()
    _, alive = psutil.wait_procs(family, timeout=20)
    for proc in alive:
        proc.kill()
    psutil.wait_procs(alive, timeout=10)


@contextmanager
def ray_head(num_cpus: int = 2, env: dict[str, str] | None = None) -> Iterator[RayHead]:
    """`ray start --head --block` on 127.0.0.1 with the dashboard, in a short temp dir (Unix
    socket paths must stay under ~100 characters)."""
    temp = tempfile.mkdtemp(prefix="tkgray-", dir="/tmp")
    base = {**os.environ, **WARM_WORKERS, **LOOPBACK, **(env or {}), "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": secrets.token_hex(32), "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_TMPDIR": temp,  # its address file is not the machine's default one
            "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    base.pop("RAY_ADDRESS", None)
    gcs, dashboard = free_port(), free_port()
    low = 20_000 + secrets.randbelow(300) * 100  # a worker port range of its own
    ports = {"--port": gcs, "--dashboard-port": dashboard,
             "--node-manager-port": free_port(), "--object-manager-port": free_port(),
             "--ray-client-server-port": free_port(), "--metrics-export-port": free_port(),
             "--dashboard-agent-listen-port": free_port(),
             "--dashboard-agent-grpc-port": free_port(),
             "--runtime-env-agent-port": free_port(),
             "--min-worker-port": low, "--max-worker-port": low + 99}
    command = [str(VENV_BIN / "ray"), "start", "--head", "--block",
               "--node-ip-address", "127.0.0.1", "--dashboard-host", "127.0.0.1",
               "--include-dashboard", "true", "--num-cpus", str(num_cpus),
               "--temp-dir", temp, *(f"{k}={v}" for k, v in ports.items())]
    log = open(Path(temp) / "head.log", "w")  # noqa: SIM115 - closed below
    process = subprocess.Popen(command, env=base, stdout=log, stderr=subprocess.STDOUT)
    head = RayHead(gcs_address=f"127.0.0.1:{gcs}", dashboard=f"http://127.0.0.1:{dashboard}",
                   env=base)
    try:
        _wait_ready(head, process, Path(temp) / "head.log")
        yield head
    finally:
        _stop(process)
        log.close()
        shutil.rmtree(temp, ignore_errors=True)


def _wait_ready(head: RayHead, process: subprocess.Popen, log: Path, timeout: float = 180
                ) -> None:
    """Until the Jobs API answers (the dashboard starts last)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"ray start exited {process.returncode}:\n{log.read_text()}")
        if head.run("job", "list", "--address", head.dashboard, timeout=60).returncode == 0:
            return
        time.sleep(2)
    raise TimeoutError(f"Ray head not ready after {timeout} s:\n{log.read_text()[-3000:]}")

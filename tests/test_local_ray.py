"""The local Ray that tkg starts (pipeline/local_ray.py): ports of its own, a failed start
retried once and then explained, two builds at once on one machine, and no Ray process left
after a build is killed. Builds run as `tkg build` subprocesses, each with its own Ray; a
build's processes are found by its own pid (its descendants) or its own session dir, never by
name."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import CORPUS

TKG = [sys.executable, "-m", "tkg.jobs.cli"]
FIXED_PORTS = (52365, 44227, 44217, 8265)  # what Ray 2.60 binds by default


@pytest.fixture(scope="module")
def config_file(config, tmp_path_factory) -> Path:
    """The test config with the synthetic extractor and embedder: what these tests check is
    Ray's processes and ports, and each `tkg build` here loads no model (spaCy and MiniLM
    cost each of the two builds at once seconds of the two cores)."""
    from tkg.pipeline.synthetic_embed import model_name

    data = config.model_dump(mode="json")
    data["extract"]["backend"] = data["embed"]["backend"] = "synthetic"
    data["embed"]["model"] = model_name(384, 0)
    path = tmp_path_factory.mktemp("ray") / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, start time) of every running process (start time tells a reused
    pid; a zombie, which holds nothing but its exit status, is not running)."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":
                found[int(entry)] = (int(fields[1]), fields[19])
    return found


def descendants(root: int) -> set[tuple[int, str]]:
    """(pid, start time) of every process below `root`."""
    table = processes()
    found, todo = set(), [root]
    while todo:
        parent = todo.pop()
        for pid, (ppid, started) in table.items():
            if ppid == parent and (pid, started) not in found:
                found.add((pid, started))
                todo.append(pid)
    return found


def alive(seen: set[tuple[int, str]]) -> set[int]:
    table = processes()
    return {pid for pid, started in seen if pid in table and table[pid][1] == started}


def name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()[:60]
    except OSError:
        return "?"


def test_the_local_ray_binds_no_fixed_port(ray_session):
    """The session's Ray is started by init_ray: its agent's HTTP port is the OS's choice
    and it exports no metrics."""
    import ray

    node = ray._private.worker.global_worker.node
    assert node.dashboard_agent_listen_port not in FIXED_PORTS
    assert node.dashboard_agent_listen_port > 0
    assert node.metrics_export_port == -1


def test_a_failed_start_is_retried_once_then_says_what_to_do():
    """A start that cannot succeed (an object store below Ray's minimum) is tried twice,
    says so, ends with what to do, and leaves no process of its sessions behind."""
    done = subprocess.run(
        [sys.executable, "-c", "from tkg.pipeline import local_ray\n"
         "local_ray.start(num_cpus=1, object_store_memory=1, include_dashboard=False, "
         "log_to_driver=False)"],
        capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode != 0
    assert done.stderr.count("the local Ray did not start") >= 2, done.stderr[-3000:]
    assert "retrying once" in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert "RayStartError" in last and "--ray-address" in last and "Ray's logs: " in last
    # Ray names its session folders after the driver's pid (`session_<time>_<pid>`): no
    # process may still name one of this driver's
    driver = Path(last.rsplit("Ray's logs: ", 1)[1].strip()).parent.name.rsplit("_", 1)[1]
    own = re.compile(rb"/session_[0-9_-]+_" + driver.encode() + rb"[/\0]")
    deadline = time.monotonic() + 30
    left = [pid for pid in processes() if own.search(_cmdline(pid))]
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = [pid for pid in processes() if own.search(_cmdline(pid))]
    assert not left, [name(p) for p in left]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def small_input(folder: Path, group: str) -> Path:
    path = folder / "messages.jsonl"
    lines = [{"group_id": group, "id": f"m{i}", "kind": "message", "conversation_id": "c1",
              "speaker": speaker, "timestamp": f"2026-03-0{i + 1}T10:00:00Z",
              "content": content}
             for i, (speaker, content) in enumerate([
                 ("Alice Walker", "I started a new job at Globex in Lisbon."),
                 ("Bob Stone", "Congratulations Alice! Is Maria Lopez on your team?"),
                 ("Alice Walker", "Yes, Maria Lopez leads the data team at Globex.")])]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_two_builds_at_once_both_succeed(config_file, tmp_path):
    """Two `tkg build` commands on one machine at the same time, each starting its own
    local Ray, while the ports a default Ray binds are held by someone else."""
    import socket

    held = []
    for port in FIXED_PORTS:  # "another Ray" on the machine
        holder = socket.socket()
        try:
            holder.bind(("127.0.0.1", port))
            holder.listen()
            held.append(holder)
        except OSError:
            holder.close()  # already held: by another Ray, which is the point
    try:
        inputs = []
        for i in range(2):
            (tmp_path / f"in{i}").mkdir()
            inputs.append(small_input(tmp_path / f"in{i}", f"g{i}"))
        builds = [subprocess.Popen(
            [*TKG, "build", "--config", str(config_file), "--input", str(inputs[i]),
             "--store", str(tmp_path / f"store{i}"), "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
        results = [b.communicate(timeout=600) for b in builds]
    finally:
        for holder in held:
            holder.close()
    for build, (out, err) in zip(builds, results, strict=True):
        assert build.returncode == 0, err[-3000:]
        summary = json.loads(out)
        assert summary["episodes"] == 3 and summary["rejected"] == 0


def test_a_killed_build_leaves_no_ray_process(config_file, tmp_path):
    """SIGKILL of a running build: every process below it (its Ray: GCS, raylet, agents,
    workers) is gone within a bounded wait."""
    build = subprocess.Popen(
        [*TKG, "build", "--config", str(config_file), "--input", str(CORPUS),
         "--store", str(tmp_path / "store")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seen: set[tuple[int, str]] = set()
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline and build.poll() is None:
            seen |= descendants(build.pid)
            names = {name(pid) for pid, _ in seen}
            if {"ray::DashboardAgent", "ray::RuntimeEnvAgent"} <= names:
                break
            time.sleep(0.1)
        assert build.poll() is None, "the build ended before its Ray was seen running"
        time.sleep(1.0)  # a worker or two
        seen |= descendants(build.pid)
        os.kill(build.pid, signal.SIGKILL)
        build.wait(30)
    finally:
        if build.poll() is None:
            build.kill()
    deadline = time.monotonic() + 60
    left = alive(seen)
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = alive(seen)
    assert not left, sorted((name(p), _status(p)) for p in left)


def _status(pid: int) -> str:
    """A process's state and parent, and whether it carries a tkg Ray token (diagnostics)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError as exc:
        return str(exc)
    lines = [line for line in status.splitlines() if line.startswith(("State", "PPid"))]
    return f"{' '.join(lines)} token={b'TKG_RAY_OWNER=' in environ}"

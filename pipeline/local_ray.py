"""The local Ray that tkg starts when no cluster is named: ports of its own, one retry, and
no process of it left behind, however the build ends.

Ports: every port of a local Ray is one the OS picks. Left alone, Ray 2.x binds a few fixed
ones (the dashboard agent's HTTP port 52365, the dashboard's metrics port 44227, the
autoscaler's 44217, the dashboard's 8265), and a second Ray on the machine held them: its
agent retried the bind and the raylet timed out waiting for it ("The current node timed out
during startup", 7 builds of 17 on a busy 2-core machine). Metrics collection is off (no
metrics export port): a build reads no Prometheus figures.

Retry: a start that fails is cleaned up and tried once more, with a line in the log; a
second failure says what to do (`--ray-address`, a less busy machine, Ray's log folder).

Nothing left behind: a watchdog, a small process in a session of its own started beside
Ray, waits on a pipe from the build; when the build's process ends (exit, exception,
SIGKILL) the pipe closes and the watchdog ends every process of that start, and nothing
else. Ray's own clean-up kills the raylet and GCS with the driver, but its agents lived on
for over a minute after a `kill -9` of a build. A process of the start is one that carries
`TKG_RAY_OWNER=<token>` in its environment (set only while `ray.init` spawns them, so later
children of the build do not), or one with a file open in the start's session folder, which
Ray names after the driver's pid (`session_<time>_<pid>`): the agents rewrite their command
line and environment area for their titles (`ray::DashboardAgent`), which hides the token.

This module imports Ray only inside `start`: the watchdog runs it as `python -m`.
"""

from __future__ import annotations

import contextlib
import glob
import inspect
import logging
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

log = logging.getLogger("tkg.ray")

OWNER_ENV = "TKG_RAY_OWNER"
# Read by Ray's dashboard and autoscaler processes when they start; 0: a port the OS picks.
PORT_ENV = {"DASHBOARD_METRIC_PORT": "0", "AUTOSCALER_METRIC_PORT": "0"}
SYSTEM_CONFIG = {"enable_metrics_collection": False}
ATTEMPTS = 2
REAP_ROUNDS = 5  # scans for stragglers (a dying raylet may still start a worker)
REAP_GRACE_S = 2.0  # SIGTERM, then SIGKILL after this


class RayStartError(RuntimeError):
    """The local Ray did not start, twice; the message says what to do."""


class Watchdog:
    """The process that ends this start's Ray processes once the build's process is gone
    (see the module docstring)."""

    def __init__(self, token: str) -> None:
        self.token = token
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tkg.pipeline.local_ray", token, str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            env={k: v for k, v in os.environ.items() if k != OWNER_ENV})

    def reap_now(self, timeout_s: float = 30.0) -> None:
        """Close the pipe (the watchdog ends this start's processes) and wait for it."""
        with contextlib.suppress(OSError):
            self.process.stdin.close()
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            log.warning("the Ray watchdog %d is still reaping after %g s",
                        self.process.pid, timeout_s)


_current: Watchdog | None = None  # the running start's: its pipe stays open while we live


def start(**options: Any) -> None:
    """`ray.init(**options)` of a local Ray with ports of its own, tried twice (see the
    module docstring); raises RayStartError with what to do."""
    global _current
    import ray

    if _current is not None:  # an earlier local Ray of this process, shut down since
        _current.reap_now()
        _current = None
    system_config = {**SYSTEM_CONFIG, **(options.pop("_system_config", None) or {})}
    options = {**options, "dashboard_port": 0}
    for attempt in range(1, ATTEMPTS + 1):
        watchdog = Watchdog(secrets.token_hex(8))
        try:
            with _owned_environment(watchdog.token), _agent_port_of_its_own():
                # a copy each time: ray.init adds its spilling settings to the one it gets
                ray.init(**options, _system_config=dict(system_config))
        except Exception as exc:
            with contextlib.suppress(Exception):
                ray.shutdown()
            watchdog.reap_now()
            cause = _first_line(exc)
            if attempt == ATTEMPTS:
                raise RayStartError(
                    f"the local Ray did not start ({cause}), twice; pass --ray-address "
                    "HOST:PORT (or set ray.address) to use a Ray that is running, or retry "
                    "when the machine is less busy (a local Ray needs free ports and a few "
                    f"seconds of CPU to start); Ray's logs: {_session_logs()}") from exc
            print(f"tkg: the local Ray did not start ({cause}); retrying once",
                  file=sys.stderr, flush=True)
            log.warning("local Ray start %d failed: %s; Ray's logs: %s", attempt, cause,
                        _session_logs())
            continue
        _current = watchdog
        return


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _session_logs() -> str:
    """The log folder of this process's latest Ray session (Ray names it after the pid)."""
    import ray._common.utils as ray_utils

    found = sorted(glob.glob(os.path.join(ray_utils.get_default_ray_temp_dir(),
                                          f"session_*_{os.getpid()}")))
    return os.path.join(found[-1], "logs") if found else ray_utils.get_default_ray_temp_dir()


@contextlib.contextmanager
def _owned_environment(token: str) -> Iterator[None]:
    """The token (and the ports' settings) in the environment the Ray processes inherit,
    only while they are spawned."""
    wanted = {OWNER_ENV: token, **{k: v for k, v in PORT_ENV.items() if k not in os.environ}}
    os.environ.update(wanted)
    try:
        yield
    finally:
        for name in wanted:
            os.environ.pop(name, None)


@contextlib.contextmanager
def _agent_port_of_its_own() -> Iterator[None]:
    """The dashboard agent's HTTP port picked by the OS: `ray.init` has no argument for it
    and Ray's own default is 52365 (`RayParams.dashboard_agent_listen_port`, Ray 2.60)."""
    from ray._private import parameter

    original = parameter.RayParams
    if "dashboard_agent_listen_port" not in inspect.signature(original).parameters:
        yield  # a Ray without the setting: nothing to change
        return

    class OwnPorts(original):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("dashboard_agent_listen_port", 0)
            super().__init__(*args, **kwargs)

    parameter.RayParams = OwnPorts
    try:
        yield
    finally:
        parameter.RayParams = original


def owned(token: str, driver: int, since: datetime) -> set[int]:
    """This user's processes of a start (see the module docstring): the token in their
    environment, or a file open in a session folder of `driver` (the build's pid) made
    `since` the watchdog started (an older one is of another process that had the pid).
    Never the driver itself, which writes its own logs there and is alive when a failed
    start is cleaned up."""
    needle = f"\0{OWNER_ENV}={token}\0".encode()
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) not in (os.getpid(), driver) and (
                needle in _environ(entry)
                or any(_session_of(f, driver, since) for f in _open_files(entry))):
            found.add(int(entry))
    return found


SESSION = re.compile(r"/session_(\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d)_\d+_(\d+)(/|$)")


def _session_of(path: str, driver: int, since: datetime) -> bool:
    """Whether `path` lies in a Ray session folder of `driver` made since `since` (Ray
    names them `session_<local time>_<microseconds>_<driver pid>`)."""
    found = SESSION.search(path)
    return bool(found) and int(found.group(2)) == driver and (
        datetime.strptime(found.group(1), "%Y-%m-%d_%H-%M-%S") >= since)


def _environ(pid: str) -> bytes:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            return b"\0" + handle.read()
    except OSError:  # gone, or another user's
        return b""


def _open_files(pid: str) -> list[str]:
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return []
    links = []
    for fd in names:
        with contextlib.suppress(OSError):
            links.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
    return links


def reap(token: str, driver: int, since: datetime) -> int:
    """End every process of the start: SIGTERM, SIGKILL after a grace; a few rounds for
    processes started meanwhile. Returns how many were signalled."""
    signalled: set[int] = set()
    for _ in range(REAP_ROUNDS):
        pids = owned(token, driver, since)
        if not pids:
            break
        signalled |= pids
        _signal(pids, signal.SIGTERM)
        deadline = time.monotonic() + REAP_GRACE_S
        while pids and time.monotonic() < deadline:
            time.sleep(0.1)
            pids = owned(token, driver, since) & pids
        _signal(pids, signal.SIGKILL)
    return len(signalled)


def _signal(pids: set[int], number: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, number)


def _watch(token: str, driver: int) -> None:
    """The watchdog: block until the pipe from the build closes, then reap."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C of the build is the build's
    since = datetime.now().replace(microsecond=0) - timedelta(seconds=1)  # Ray's local time
    with contextlib.suppress(OSError):
        while sys.stdin.buffer.read(1 << 16):
            pass
    reap(token, driver, since)


if __name__ == "__main__":
    _watch(sys.argv[1], int(sys.argv[2]))

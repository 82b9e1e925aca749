"""The KubeRay RayJob of the nightly build (configs/rayjob-nightly.yaml) is held to the README:
its entrypoint is the one the sizing section shows, that command parses as a tkg build
whose config ships in the image, and the cluster it asks for has the GPUs that config's
model stages take."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = ROOT / "configs" / "rayjob-nightly.yaml"
IMAGE_ROOT = "/opt/tkg/"  # configs/cluster.Dockerfile's WORKDIR


def _manifest() -> dict:
    return yaml.safe_load(MANIFEST.read_text())


def _readme_entrypoint() -> str:
    """The entrypoint line of the README's RayJob block (under "Sizing a cluster")."""
    section = (ROOT / "README.md").read_text().split("### Sizing a cluster", 1)[1]
    block = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
    return yaml.safe_load(block)["spec"]["entrypoint"]


def test_the_manifest_is_a_rayjob_with_the_readmes_entrypoint():
    job = _manifest()
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    assert job["spec"]["entrypoint"] == _readme_entrypoint()
    assert job["spec"]["shutdownAfterJobFinishes"] is True


def test_the_entrypoint_is_a_build_whose_config_ships_in_the_image():
    from tkg.jobs.cli import parser
    from tkg.pipeline.config import load_config

    # the shell expands $(date ...) on the head; a word of the command all the same
    argv = shlex.split(re.sub(r"\$\([^)]*\)", "DAY", _manifest()["spec"]["entrypoint"]))
    assert argv[:3] == ["python", "-m", "tkg.jobs.backfill"]
    args = parser(["build", *argv[3:]]).parse_args(["build", *argv[3:]])
    assert args.config.startswith(IMAGE_ROOT) and args.json
    assert args.store.startswith("s3://")
    dockerfile = (ROOT / "configs" / "cluster.Dockerfile").read_text()
    assert f"WORKDIR {IMAGE_ROOT.rstrip('/')}" in dockerfile
    assert "COPY configs configs" in dockerfile
    config = load_config(ROOT / args.config.removeprefix(IMAGE_ROOT))
    assert config.ray.address is None  # the job's driver joins the RayJob's cluster


def test_the_cluster_has_the_gpus_its_config_takes():
    import ray
    from tkg.pipeline.config import load_config

    job = _manifest()
    cluster = job["spec"]["rayClusterSpec"]
    assert cluster["rayVersion"] == ray.__version__
    assert f"rayproject/ray:{ray.__version__}-" in (
        ROOT / "configs" / "cluster.Dockerfile").read_text()
    assert cluster["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    gpus = sum(int(group["replicas"]) * int(container["resources"]["limits"].get(
        "nvidia.com/gpu", 0)) for group in cluster["workerGroupSpecs"]
        for container in group["template"]["spec"]["containers"])
    config = load_config(ROOT / "configs" / "cluster.yaml")
    wanted = config.llm.vllm.gpus * config.llm.vllm.tensor_parallel_size * \
        config.llm.vllm.pipeline_parallel_size + (config.embed.actors or 0) * \
        config.embed.gpus_per_actor
    assert gpus >= wanted, (gpus, wanted)

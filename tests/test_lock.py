"""The lock (uv.lock) and what the project declares and installs: they never disagree."""
import importlib.metadata
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
LOCK = tomllib.loads((ROOT / "uv.lock").read_text())
PACKAGES = {canonicalize_name(p["name"]): p for p in LOCK["package"]}


def _declared() -> set[tuple[str, str, str]]:
    """(name, specifier, extra) of every dependency pyproject.toml declares."""
    project = PYPROJECT["project"]
    groups = {"": project["dependencies"], **project["optional-dependencies"]}
    out = set()
    for extra, lines in groups.items():
        for line in lines:
            req = Requirement(line)
            out.add((canonicalize_name(req.name), str(req.specifier), extra))
    return out


def _locked() -> set[tuple[str, str, str]]:
    """The same triples as uv.lock recorded them when it was last resolved."""
    out = set()
    for dep in PACKAGES["tkg"]["metadata"]["requires-dist"]:
        extra = re.search(r"extra == '([^']+)'", dep.get("marker", ""))
        spec = str(Requirement(f"x{dep.get('specifier', '')}").specifier)
        out.add((canonicalize_name(dep["name"]), spec, extra.group(1) if extra else ""))
    return out


def test_the_lock_was_resolved_from_this_pyproject():
    declared, locked = _declared(), _locked()
    assert declared - locked == set(), "in pyproject.toml, not in uv.lock: run `make lock`"
    assert locked - declared == set(), "in uv.lock, not in pyproject.toml: run `make lock`"


def test_uv_agrees_that_the_lock_is_current():
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if uv is None:
        pytest.fail("uv is missing from the venv: `make install-dev` installs it")
    done = subprocess.run([uv, "lock", "--check", "--offline"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_the_lock_covers_the_gpu_images_platforms():
    """Python 3.11 and 3.12 on Linux x86_64, with the vLLM that ray[llm] 2.60 pins."""
    markers = " ".join(LOCK["resolution-markers"])
    assert "python_full_version == '3.12.*'" in markers
    assert "python_full_version < '3.12'" in markers
    assert PACKAGES["vllm"]["version"] == "0.29.0"
    assert set(PACKAGES["tkg"]["optional-dependencies"]) == {"dev", "gpu"}
    gpu = {canonicalize_name(d["name"]) for d in PACKAGES["tkg"]["optional-dependencies"]["gpu"]}
    assert {"ray", "vllm", "flagembedding"} <= gpu


def test_this_environment_has_the_locked_versions():
    """What `make test` installed is what the lock says (a drifted venv fails here)."""
    drifted = []
    for name in ("transformers", "torch", "flagembedding", "ray", "pyarrow", "lancedb",
                 "numpy", "spacy", "sentence-transformers", "duckdb"):
        locked = Version(PACKAGES[name]["version"])
        installed = Version(importlib.metadata.version(name))
        if installed.public != locked.public:
            drifted.append(f"{name} {installed} (locked {locked})")
    assert drifted == [], "reinstall with `make clean test`: " + ", ".join(drifted)


def test_the_lock_holds_transformers_to_what_flagembedding_imports():
    """FlagEmbedding 1.4.2 imports transformers.modeling_attn_mask_utils (gone in 5.24)."""
    assert Version(PACKAGES["transformers"]["version"]) < Version("5.24")
    __import__("transformers.modeling_attn_mask_utils")


def test_the_gpu_image_installs_from_the_same_lock_and_uv():
    dockerfile = (ROOT / "configs" / "cluster.Dockerfile").read_text()
    makefile = (ROOT / "Makefile").read_text()
    uv_version = re.search(r"^UV_VERSION := (\S+)", makefile, re.M).group(1)
    assert f"ARG UV_VERSION={uv_version}" in dockerfile
    export = re.search(r"^EXPORT  := \$\(UV\) (.+)$", makefile, re.M).group(1)
    assert f"uv {export} --extra gpu" in dockerfile
    assert "-c /tmp/constraints-gpu.txt '.[gpu]'" in dockerfile

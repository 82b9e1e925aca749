from pathlib import Path

import pytest
from pydantic import ValidationError
from tkg.pipeline.config import TkgConfig, load_config

ROOT = Path(__file__).resolve().parents[1]


def test_local_yaml_is_the_embedded_default():
    config = load_config(ROOT / "configs" / "local.yaml")
    assert config.extract.backend == "spacy"
    assert config.embed.backend == "sentence_transformers"
    assert config.ray.address is None
    assert config.fingerprint() == TkgConfig().fingerprint()


def test_unknown_keys_are_errors(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("extract:\n  bakend: spacy\n")
    with pytest.raises(ValidationError, match="bakend"):
        load_config(path)


def test_missing_file_says_what_to_use(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"configs/local\.yaml"):
        load_config(tmp_path / "nope.yaml")


def test_config_is_immutable():
    config = TkgConfig()
    with pytest.raises(ValidationError):
        config.extract.context_messages = 9  # type: ignore[misc]

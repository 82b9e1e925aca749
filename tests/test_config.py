import ast
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError
from tkg.pipeline.config import ConfigError, TkgConfig, load_config

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
    with pytest.raises(ConfigError, match=r"bad\.yaml:2: extract\.bakend: unknown key"):
        load_config(path)


@pytest.mark.parametrize(("text", "message"), [
    ("ray:\n  num_cpus: many\n", r"bad\.yaml:2: ray\.num_cpus: .*integer.*'many'"),
    ("ray:\n  num_cpus: [1\n", r"bad\.yaml:3: not valid YAML"),
    ("extract:\n\tbackend: spacy\n", r"bad\.yaml:2: not valid YAML"),
    ("- a\n- b\n", r"bad\.yaml: expected a mapping"),
])
def test_bad_configs_are_one_line_naming_file_line_and_key(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as raised:
        load_config(path)
    assert "\n" not in str(raised.value)


def test_missing_file_says_what_to_use(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"configs/local\.yaml"):
        load_config(tmp_path / "nope.yaml")


def test_config_is_immutable():
    config = TkgConfig()
    with pytest.raises(ValidationError):
        config.extract.context_messages = 9  # type: ignore[misc]


def _sections(model: type[BaseModel], path: tuple[str, ...] = ()):
    """(path, model) of every config section, nested ones (llm.vllm, facts.ending) included."""
    for name, info in model.model_fields.items():
        for kind in (info.annotation, *getattr(info.annotation, "__args__", ())):
            if isinstance(kind, type) and issubclass(kind, BaseModel):
                yield from _sections(kind, (*path, name))
                break
    if path:
        yield path, model


def _names_used(path: Path) -> set[str]:
    """`.attr` for every attribute access of a module, bare names for the rest."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute):
            names.add("." + node.attr)
        elif isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.alias):
            names.add(node.name.rsplit(".", 1)[-1])
    return names


def config_readers() -> dict[str, list[str]]:
    """Each config field -> the modules of pipeline/, query/ and jobs/ that read it: those
    that access `.field` and also name its section (`.section` or the section's class)."""
    modules = {str(p.relative_to(ROOT)): _names_used(p)
               for folder in ("pipeline", "query", "jobs") for p in (ROOT / folder).rglob("*.py")
               if p != ROOT / "pipeline" / "config.py"}
    readers = {}
    for path, model in _sections(TkgConfig):
        marks = {"." + path[-1], model.__name__}
        for field in model.model_fields:
            readers[".".join((*path, field))] = sorted(
                m for m, names in modules.items() if "." + field in names and names & marks)
    return readers


def test_every_config_field_is_read_by_the_code_it_configures():
    readers = config_readers()
    assert len(readers) > 100  # every section walked, nested ones included
    unread = [field for field, modules in readers.items() if not modules]
    assert not unread, f"config fields nothing reads (remove them or wire them): {unread}"

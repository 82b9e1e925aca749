"""Documentation that cannot drift: the generated config reference, and (below) the README's
runnable commands."""

from __future__ import annotations

from typing import Literal

from jobs import docs
from jobs.cli import main
from pipeline.config import TkgConfig


def test_config_reference_is_current():
    """Fails when someone changes pipeline/config.py without regenerating the page."""
    assert docs.CONFIG_DOC.is_file(), "docs/config.md is missing: run `.venv/bin/tkg docs config`"
    assert docs.CONFIG_DOC.read_text() == docs.render_config_reference(), (
        "docs/config.md is stale: run `.venv/bin/tkg docs config` and commit it")


def test_every_field_is_documented():
    text = docs.render_config_reference()
    keys = [f"{s.path}.{name}" if s.path else name
            for s in docs.sections(TkgConfig)
            for name, field in s.model.model_fields.items()
            if not docs._is_model(field.annotation)]
    assert len(keys) > 40
    missing = [key for key in keys if f"| `{key}` |" not in text]
    assert missing == []
    row = "| `extract.context_messages` | int (>= 0) | `4` | previous messages given as context |"
    assert row in text
    assert "| residence | LIVES_IN |" in text


def test_type_names():
    assert docs.type_name(int | None) == "int | null"
    assert docs.type_name(Literal["auto", "float32"]) == '"auto" | "float32"'
    assert docs.type_name(tuple[str, ...]) == "list of str"
    assert docs.type_name(dict[str, float]) == "mapping of str to float"
    assert docs.yaml_value(None) == "null"
    assert docs.yaml_value(("a", "b")) == "[a, b]"
    assert docs.yaml_value("null") == "'null'"


def test_cli_check_and_write(tmp_path, capsys):
    page = tmp_path / "config.md"
    page.write_text("old\n")
    assert main(["docs", "config", "--out", str(page), "--check"]) == 1
    assert "stale" in capsys.readouterr().out
    assert main(["docs", "config", "--out", str(page)]) == 0
    assert page.read_text() == docs.render_config_reference()
    assert main(["docs", "config", "--out", str(page), "--check"]) == 0

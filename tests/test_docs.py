"""Documentation that cannot drift: the generated config reference, and (below) the README's
runnable commands."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Literal

import pytest
from tkg.jobs import docs
from tkg.jobs.cli import main
from tkg.pipeline.config import TkgConfig


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


# --- README: the Layout section is the tree's -------------------------------------------

def test_readme_layout_is_current():
    """Fails when a module was added, moved, removed or given another first sentence without
    regenerating the README's Layout."""
    text = docs.README.read_text()
    assert docs.with_layout(text, docs.render_layout()) == text, (
        "README.md's Layout is stale: run `.venv/bin/tkg docs layout` and commit it")


def test_first_sentence():
    assert docs.first_sentence("One. Two.\n\nMore.") == "One."
    assert docs.first_sentence("Wrapped\nover lines, e.g. here; ends here.") == (
        "Wrapped over lines, e.g. here; ends here.")
    assert docs.first_sentence("Run `cd . && ls`. Then.") == "Run `cd . && ls`."
    assert docs.first_sentence("A list follows:\n\n- one") == "A list follows"
    assert docs.first_sentence("") == ""


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_layout_lists_every_module_with_its_docstring(tmp_path):
    root = _tree(tmp_path, {
        "pipeline/__init__.py": "", "pipeline/zeta.py": '"""Zeta does z. Not this."""\n',
        "pipeline/sub/__init__.py": '"""A package."""\n', "pipeline/sub/alpha.py": "x = 1\n",
        "pipeline/beta.py": '"""Beta | pipes."""\n',
        "query/__init__.py": '"""Retrieval. More."""\n', "jobs/cli.py": '"""`tkg`."""\n'})
    lines = docs.render_layout(root).splitlines()
    assert lines[0] == docs.LAYOUT_BEGIN and lines[-1] == docs.LAYOUT_END
    rows = [line for line in lines if line.startswith("| `")]
    assert rows == ["| `beta.py` | Beta \\| pipes. |", "| `sub/` | A package. |",
                    "| `sub/alpha.py` |  |", "| `zeta.py` | Zeta does z. |",
                    "| `cli.py` | `tkg`. |"]
    assert "`pipeline/` (`tkg.pipeline`)" in lines
    assert "`query/` (`tkg.query`): Retrieval." in lines


def test_cli_layout_check_and_write(tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text(f"# t\n\n{docs.LAYOUT_BEGIN}\nold\n{docs.LAYOUT_END}\n\nafter\n")
    assert main(["docs", "layout", "--readme", str(readme), "--check"]) == 1
    assert "stale" in capsys.readouterr().out
    assert main(["docs", "layout", "--readme", str(readme)]) == 0
    assert readme.read_text() == f"# t\n\n{docs.render_layout()}\n\nafter\n"
    assert main(["docs", "layout", "--readme", str(readme), "--check"]) == 0
    readme.write_text("# no markers\n")
    with pytest.raises(ValueError, match="layout markers"):
        docs.layout_is_stale(readme)


# --- README: every block marked runnable works ------------------------------------------

README = docs.ROOT / "README.md"
MARKER = "<!-- runnable -->"
FENCE = re.compile(r"^<!-- runnable -->\n```(bash|sh|sql|python)\n(.*?)^```$", re.S | re.M)
BLOCK_TIMEOUT = 180


def runnable_blocks(text: str) -> list[tuple[str, str]]:
    """(language, code) of each fenced block right after a `<!-- runnable -->` line: bash and
    python run in a copy of the repo root whose `.tkg/demo` is the corpus store, sql on its
    catalog."""
    blocks = [(m.group(1), m.group(2)) for m in FENCE.finditer(text)]
    markers = re.findall(rf"^{MARKER}$", text, re.M)
    assert len(blocks) == len(markers), "a runnable marker must precede a ```bash/sql/python block"
    return blocks


def test_runnable_marker_parsing():
    text = (f"intro\n{MARKER}\n```bash\necho hi\n```\n\n```bash\nmake demo\n```\n"
            f"{MARKER}\n```sql\nSELECT 1;\n```\nprose naming {MARKER} inline\n"
            f"{MARKER}\n```python\nprint(1)\n```\n")
    assert runnable_blocks(text) == [("bash", "echo hi\n"), ("sql", "SELECT 1;\n"),
                                     ("python", "print(1)\n")]


@pytest.fixture(scope="module")
def readme_cwd(corpus_build, tmp_path_factory) -> Path:
    """A folder that looks like the repo root, with `.tkg/demo` being the corpus store: the
    README's commands run unchanged, and files they write land here, not in the repo."""
    cwd = tmp_path_factory.mktemp("readme")
    for entry in docs.ROOT.iterdir():
        if entry.name not in (".tkg", ".git"):
            (cwd / entry.name).symlink_to(entry)
    (cwd / ".tkg").mkdir()
    (cwd / ".tkg" / "demo").symlink_to(corpus_build.snapshot.parent.parent)
    return cwd


def test_readme_runnable_blocks(readme_cwd):
    blocks = runnable_blocks(README.read_text())
    assert blocks, f"README.md has no {MARKER} blocks"
    import duckdb
    from tkg.pipeline.store import connect

    failures = []
    for language, code in blocks:
        if language == "sql":
            with connect(readme_cwd / ".tkg" / "demo") as con:
                for statement in filter(str.strip, code.split(";")):
                    try:
                        con.execute(statement).fetchall()
                    except duckdb.Error as exc:
                        failures.append(f"{statement.strip()}\n-> {exc}")
            continue
        command = ([".venv/bin/python", "-c", code] if language == "python"
                   else ["bash", "-euo", "pipefail", "-c", code])
        done = subprocess.run(command, stdin=subprocess.DEVNULL, cwd=readme_cwd,
                              capture_output=True, text=True, timeout=BLOCK_TIMEOUT)
        if done.returncode != 0:
            failures.append(f"{code}\n-> exit {done.returncode}: {done.stderr[-2000:]}")
    assert not failures, "README commands that fail:\n\n" + "\n\n".join(failures)

"""Every `tkg bench` command at a tiny size, through the command line, on the session's Ray:
each prints one JSON object whose figures describe what it ran (not its speed), so a
benchmark cannot silently break again (`tkg bench resolution` crashed for a wave unseen).
The graph bench has its own smoke test (tests/test_bench_graph.py)."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.conftest import SHARED_DATA

# benches whose smoke test lives elsewhere
ELSEWHERE = {"graph": "tests/test_bench_graph.py", "query": "tests/test_query_bench.py"}


def _bench(capfd, *argv: str) -> dict:
    """`tkg bench ARGV --json` in this process; its one JSON object."""
    from tkg.jobs.cli import main

    capfd.readouterr()
    assert main(["bench", *argv, "--json"]) == 0
    lines = [line for line in capfd.readouterr().out.splitlines() if line.startswith("{")]
    assert len(lines) == 1, lines
    return json.loads(lines[0])


@pytest.fixture(scope="module")
def config_file(config, tmp_path_factory) -> str:
    """The test config (one actor per model, two partitions) as a file for --config."""
    path = tmp_path_factory.mktemp("bench-config") / "config.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    return str(path)


def test_every_bench_has_a_smoke_test():
    from tkg.jobs.bench import BENCHES

    here = {name.removeprefix("test_bench_").replace("_", "-") for name in globals()
            if name.startswith("test_bench_")}
    assert set(BENCHES) - set(ELSEWHERE) <= here


def test_bench_build(ray_session, config_file, capfd):
    figures = _bench(capfd, "build", "--episodes", "40", "--config", config_file)
    assert figures["episodes"] == 40 and figures["rejected"] == 0
    assert figures["entities"] > 0 and figures["facts"] > 0
    assert figures["episodes_per_second"] > 0
    assert {"extract", "resolve", "communities"} <= set(figures["seconds"])
    assert figures["model_seconds"] + figures["non_model_seconds"] == pytest.approx(
        figures["wall_seconds"], abs=0.05)


def test_bench_resolution(ray_session, config_file, capfd):
    figures = _bench(capfd, "resolution", "--mentions", "2000", "--dim", "32",
                     "--config", config_file)
    assert figures["mentions"] == 2000
    assert 0 < figures["resolved_entities"] <= figures["name_nodes"]
    assert figures["precision"] >= 0.9 and figures["recall"] >= 0.9
    assert {"names", "resolve"} <= set(figures["stage_seconds"])


def test_bench_locomo(ray_session, config_file, capfd, tmp_path):
    """One LoCoMo session (from ../shared/data, trimmed into tmp_path) built and scored."""
    source = SHARED_DATA / "locomo10.json"
    if not source.is_file():
        pytest.skip("../shared/data/locomo10.json is absent")
    sample = json.loads(source.read_text())[0]
    conversation = {key: sample["conversation"][key] for key in
                    ("speaker_a", "speaker_b", "session_1", "session_1_date_time")}
    questions = [q for q in sample["qa"] if q.get("evidence")
                 and all(e.startswith("D1:") for e in q["evidence"])]
    data = tmp_path / "locomo.json"
    data.write_text(json.dumps([{**sample, "conversation": conversation, "qa": questions}]))
    figures = _bench(capfd, "locomo", "--data", str(data), "--config", config_file,
                     "--workdir", str(tmp_path / "work"))
    assert figures["samples"] == 1
    assert figures["episodes"] == len(conversation["session_1"])
    assert figures["questions"] == sum(q["category"] in (1, 2, 3, 4) for q in questions) > 0
    for recipe in figures["recipes"].values():
        assert recipe["overall"]["questions"] == figures["questions"]
        assert 0 <= recipe["overall"]["recall@10"] <= 1


def test_bench_communities(capfd):
    figures = _bench(capfd, "communities", "--nodes", "2000", "--edges", "8000",
                     "--community-size", "40")
    assert (figures["nodes"], figures["edges"]) == (2000, 8000)
    assert figures["communities"] > 0 and figures["nmi_vs_planted"] > 0.5
    assert figures["peak_rss_gb"] > 0


def test_bench_serve(capfd, tmp_path):
    figures = _bench(capfd, "serve", "--facts", "1000", "--seconds", "3", "--concurrency",
                     "2", "--dim", "32", "--processes", "1", "--workdir", str(tmp_path / "s"))
    assert figures["requests"] > 0 and figures["errors"] == 0
    assert figures["published_mid_run"] is True
    assert set(figures["requests_per_snapshot"]) <= {"bench-1", "bench-2"}


def test_bench_incremental(ray_session, config_file, capfd):
    """Synthetic models (what the 10k-160k store figures use); the models' incremental
    runs are tests/test_incremental.py's."""
    figures = _bench(capfd, "incremental", "--episodes", "40", "--new", "10",
                     "--embed", "synthetic", "--extract", "synthetic", "--config", config_file)
    assert (figures["episodes"], figures["new"]) == (40, 10)
    assert (figures["embed"], figures["extract"]) == ("synthetic", "synthetic")
    assert figures["full_seconds"] > 0 and figures["incremental_seconds"] > 0
    assert figures["rows_written"] > 0 and figures["rows_read"] > 0
    assert figures["facts_current"] <= figures["facts"]
    assert figures["night_peak_driver_rss_mb"] >= figures["night_start_driver_rss_mb"] > 0
    assert figures["night_driver_rss_growth_mb"] >= 0
    peaks = figures["night_stage_peak_driver_rss_mb"]
    assert peaks.keys() == figures["seconds"].keys()
    assert 0 < max(peaks.values()) <= figures["night_peak_driver_rss_mb"]
    retrieval = figures["night_retrieval_seconds"]
    assert {"episodes", "facts", "entities"} <= retrieval["tables"].keys()
    assert all(t["arrays_s"] >= 0 and t["table_s"] >= 0 for t in retrieval["tables"].values())
    assert retrieval["seconds"] >= max(t["table_s"] for t in retrieval["tables"].values())


def test_bench_scale(ray_session, config_file, capfd):
    """Both paths at a tiny size, synthetic models: the same graph, figures per stage."""
    figures = _bench(capfd, "scale", "--episodes", "60", "--config", config_file)
    assert set(figures["paths"]) == {"driver", "ray_data"}
    driver, ray_data = figures["paths"]["driver"], figures["paths"]["ray_data"]
    for key in ("entities", "facts", "communities"):
        assert driver[key] == ray_data[key] > 0, key
    for run in (driver, ray_data):
        assert run["peak_driver_rss_mb"] > 0 and run["spilled_mb"] >= 0
        assert run["stages"]["extract"]["in"] == 60 and run["stages"]["facts"]["out"] > 0
        assert all(s["peak_driver_rss_mb"] > 0 for s in run["stages"].values())
    assert ray_data["peak_worker_rss_mb"] > 0  # actor pools and Ray Data tasks ran


def test_bench_forget(ray_session, config_file, capfd):
    """A build of 60 episodes, then whole conversations of one group (a tenth) forgotten
    from a copy and purged: what went is what was chosen."""
    figures = _bench(capfd, "forget", "--episodes", "60", "--share", "0.1",
                     "--config", config_file)
    assert figures["episodes"] == 60 and figures["conversations"] >= 1
    assert figures["forgotten_episodes"] >= 6
    assert figures["removed"]["episodes"] == figures["forgotten_episodes"]
    assert figures["full_seconds"] > 0 and figures["forget_seconds"] > 0
    assert figures["rows_read"] > 0 and figures["rows_written"] > 0
    assert figures["snapshots_retired"] == 1 and figures["work_dirs_removed"] == 2
    assert 0 < figures["snapshot_files_purged"] < figures["snapshot_files_before"]

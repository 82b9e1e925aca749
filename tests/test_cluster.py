"""Off one machine: the nightly job submitted with `ray job submit` to a multi-node Ray cluster
of its own (a CPU-less head and two worker nodes, loopback only, token auth), inputs and store
on the S3 server (the chain of tests/cluster_build.py, fixture `cluster_chain`); what the store
holds afterwards is checked in tests/test_s3_build.py."""

from __future__ import annotations

from tkg.pipeline import storage, store

from tests.cluster_build import LATER_RUN, RUN


def test_submitted_driver_joins_without_local_settings(config, monkeypatch):
    """Under `ray job submit` (RAY_ADDRESS set) a config with `ray.address: null` joins the
    cluster and asks for no local-only setting, which a running cluster refuses."""
    from tkg.pipeline.build import _worker_pool, joins_cluster

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert not joins_cluster(config) and _worker_pool(config)
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    assert joins_cluster(config) and _worker_pool(config) is None


def test_a_job_killed_mid_extraction_resumes_on_a_changed_cluster(cluster_chain):
    """Job 1 (`ray.address: null`) dies at extraction chunk 1 with chunk 0 kept on S3, worker
    node 0 is killed and a fresh one joins, job 2 (same command and run id) resumes."""
    report = cluster_chain.report
    assert report["nodes"] == 3 and report["nodes_after"] == 3  # head + 2 workers
    crashed, resumed = report["crashed"], report["resumed"]
    assert crashed["status"] == "FAILED" and crashed["returncode"] != 0
    assert "InjectedCrash: TKG_FAULT=extract_batch:1" in crashed["log"], crashed["log"]
    after = report["after_crash"]
    assert after["planned"]["chunks"] == 2 and after["finished"] == ["00000"]
    assert after["current"] is None
    assert resumed["status"] == "SUCCEEDED" and resumed["returncode"] == 0, resumed["log"]
    assert f"snapshot: {cluster_chain.store}/snapshots/{RUN}" in resumed["log"]


def test_ray_job_submit_with_address_auto_publishes(cluster_chain, s3_config):
    """`ray.address: auto` (job 3, a later input) runs under `ray job submit` as well and
    publishes the store's current snapshot."""
    storage.configure(s3_config.storage)  # a local build in between configures no endpoint
    auto = cluster_chain.report["auto"]
    assert auto["status"] == "SUCCEEDED" and auto["returncode"] == 0, auto["log"]
    assert store.current_run(cluster_chain.store) == LATER_RUN
    manifest = store.read_manifest(store.current_snapshot(cluster_chain.store))
    assert manifest["inputs"] and all(f.startswith(cluster_chain.later_input)
                                      for f in manifest["inputs"])


def _ran(placement: dict, *words: str) -> list[str]:
    """The nodes of the job's tasks and actors whose name holds one of `words`."""
    named = [(t["name"], t["node_id"]) for t in placement["tasks"]
             if "DRIVER" not in t["type"]]
    named += [(a["class_name"], a["node_id"]) for a in placement["actors"]]
    return [node for name, node in named if any(word in name for word in words)]


def test_the_resumed_build_ran_on_ray_data_on_the_worker_nodes(cluster_chain):
    """The resumed job (driver path off) ran its extraction, embedding and shuffles as Ray
    tasks and actors on the worker nodes, as Ray's state API lists them: none on the head,
    none in the driver (work in the driver makes no task)."""
    placement = cluster_chain.report["placement"]
    head = set(placement["head"])
    assert head and placement["tasks"]
    for what, words in (("extraction", ("ExtractBatch",)), ("embedding", ("EmbedColumn",)),
                        ("shuffle", ("HashShuffle", "Aggregator", "Join"))):
        nodes = _ran(placement, *words)
        assert nodes, f"no {what} task or actor: {sorted({t['name'] for t in placement['tasks']})}"
        assert not head & set(nodes), f"{what} ran on the head"

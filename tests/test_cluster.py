"""Joining a cluster: what a driver submitted with `ray job submit` asks of Ray (the end-to-end
runs against a head of their own are in tests/cluster_e2e.py)."""

from __future__ import annotations


def test_submitted_driver_joins_without_local_settings(config, monkeypatch):
    """Under `ray job submit` (RAY_ADDRESS set) a config with `ray.address: null` joins the
    cluster and asks for no local-only setting, which a running cluster refuses."""
    from tkg.pipeline.build import _worker_pool, joins_cluster

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert not joins_cluster(config) and _worker_pool(config)
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    assert joins_cluster(config) and _worker_pool(config) is None

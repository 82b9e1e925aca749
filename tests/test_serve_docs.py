"""Serving that explains itself, over the sample corpus (the session's `corpus_build`):
`/docs` needs no network, the OpenAPI document names the key header and the `group_id`
parameter, and a search naming a group without data says so (HTTP and `tkg search`)
without telling one tenant anything about another's groups."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from urllib.parse import urljoin, urlsplit

import pytest
from fastapi.testclient import TestClient
from tkg.query import keys as api_keys
from tkg.query.serve import create_app

LOCAL_HOSTS = {"", "127.0.0.1", "localhost", "testserver"}


@pytest.fixture(scope="module")
def served(corpus_build, tmp_path_factory):
    keys_file = tmp_path_factory.mktemp("docs") / "keys.json"
    keys = {"acme": api_keys.add(keys_file, "acme-app", ["acme"]),
            "acme+ghost": api_keys.add(keys_file, "new-tenant", ["acme", "ghost"])}
    store_dir = corpus_build.snapshot.parent.parent
    with TestClient(create_app(store_dir, keys_file, watch=False)) as client:
        yield {"client": client, "keys": keys, "store": store_dir}


def test_docs_load_with_no_external_host(served):
    client = served["client"]
    page = client.get("/docs")
    assert page.status_code == 200 and "swagger-ui" in page.text
    urls = re.findall(r"""(?:src|href)=["']([^"']+)""", page.text)
    urls += re.findall(r"""url:\s*["']([^"']+)""", page.text)
    urls += re.findall(r"https?://[^\s\"'<>)]+", page.text)
    assert any(u.endswith(".js") for u in urls) and any(u.endswith(".css") for u in urls)
    for url in urls:
        assert urlsplit(url).hostname in (None, *LOCAL_HOSTS), url
        assert client.get(urljoin("/docs", url)).status_code == 200, url
    spec = client.get("/openapi.json")
    assert spec.status_code == 200
    hosts = {urlsplit(u).hostname for u in re.findall(r"https?://[^\s\"'<>)\\]+", spec.text)}
    assert hosts <= LOCAL_HOSTS, hosts
    assert client.get("/redoc").status_code == 404  # (FastAPI's ReDoc page loads a CDN)


def test_openapi_names_the_key_header_and_group_id(served):
    spec = served["client"].get("/openapi.json").json()
    schemes = spec["components"]["securitySchemes"]
    assert {"scheme": "bearer", "type": "http"}.items() <= schemes["bearer"].items()
    assert schemes["apiKey"]["in"] == "header" and schemes["apiKey"]["name"] == "X-API-Key"
    assert "Authorization: Bearer" in spec["info"]["description"]
    for path in ("/facts/{edge_id}/history", "/entities/{entity_id}"):
        operation = spec["paths"][path]["get"]
        group_id = next(p for p in operation["parameters"] if p["name"] == "group_id")
        assert group_id["in"] == "query" and "repeatable" in group_id["description"]
        assert {"bearer": []} in operation["security"]
        assert "?group_id=" in spec["info"]["description"]


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_a_group_without_data_warns_and_tells_nothing_of_others(served):
    client, keys = served["client"], served["keys"]
    body = {"query": "Maria Lopez", "group_ids": ["acme", "ghost"], "limit": 3}
    answer = client.post("/search", json=body, headers=auth(keys["acme+ghost"]))
    assert answer.status_code == 200
    assert answer.json()["facts"]
    assert len(answer.json()["warnings"]) == 1 and "'ghost'" in answer.json()["warnings"][0]
    plain = client.post("/search", json={**body, "group_ids": ["acme"]},
                        headers=auth(keys["acme+ghost"]))
    assert plain.json()["warnings"] == []
    # household exists (another key's), nowhere does not: one answer for both
    refusals = [client.post("/search", json={**body, "group_ids": [group]},
                            headers=auth(keys["acme"])) for group in ("household", "nowhere")]
    assert [r.status_code for r in refusals] == [403, 403]
    assert (refusals[0].json()["detail"].replace("household", "G")
            == refusals[1].json()["detail"].replace("nowhere", "G"))
    assert "warnings" not in refusals[0].json()


def test_tkg_search_warns_on_stderr(served):
    done = subprocess.run(
        [sys.executable, "-m", "tkg.jobs.cli", "search", "--store", str(served["store"]),
         "--group", "acme", "--group", "ghost", "--query", "Maria Lopez", "--limit", "2",
         "--json"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["facts"] and len(result["warnings"]) == 1
    warned = [line for line in done.stderr.splitlines() if "warning" in line]
    assert len(warned) == 1 and "'ghost'" in warned[0] and "no data" in warned[0]

"""The HTTP API against a real server: ``python -m fairpool.api`` in a subprocess on a free
loopback port, with a temporary ``--home``, driven with httpx.

One server serves the module (each test uses pools and components of its own); the shutdown
test runs servers of its own.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text

from fairpool.api.server import _listen
from fairpool.store.db import SCHEMA_HEAD, Database
from tests.conftest import BACKENDS, Backend
from tests.servers import ApiServer, free_port, running, server_on, serving

API = "/api/v1"
TERMINAL = {"released", "rejected", "preempted", "cancelled"}


@pytest.fixture(scope="module", params=BACKENDS)
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[ApiServer]:
    """One server per backend for the module's tests: on the embedded SQLite store, and on a
    PostgreSQL database of its own."""
    running = server_on(request, request.param, tmp_path_factory.mktemp("api"))
    running.start()
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def client(server: ApiServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url + API, timeout=30.0) as c:
        yield c


def ok(response: httpx.Response, status: int = 200) -> Any:
    assert response.status_code == status, response.text
    return response.json() if response.content else None


def setup_pool(
    client: httpx.Client, pool: str, component: str, capacity: dict[str, int], **policy: Any
) -> None:
    ok(client.post("/pools", json={"name": pool, "capacity": capacity}), 201)
    ok(client.post(f"/pools/{pool}/policies", json={"component": component, **policy}), 201)


def submit(client: httpx.Client, component: str, **resources: int) -> dict[str, Any]:
    body: dict[str, Any] = ok(
        client.post("/requests", json={"component": component, "resources": resources}), 201
    )
    return body


def poll_until(check: Callable[[], bool], seconds: float = 30, every: float = 0.05) -> float:
    """Seconds until ``check()`` held; fails after ``seconds``."""
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > seconds:
            pytest.fail(f"condition not met within {seconds} s")
        time.sleep(every)
    return time.monotonic() - started


# -- the tour ----------------------------------------------------------------------------


def test_tour(client: httpx.Client) -> None:
    pool = ok(client.post("/pools", json={"name": "tour-gpus", "capacity": {"gpu": 4, "step_run": 32},
                                          "description": "Shared training GPUs"}), 201)
    assert pool["capacity"] == {"gpu": 4, "step_run": 32} and pool["occupied"] == {"gpu": 0, "step_run": 0}
    policy = ok(client.post("/pools/tour-gpus/policies", json={
        "component": "tour-orch", "priority": 10, "reserved": {"gpu": 2}, "limit": {"gpu": 4}}), 201)
    assert policy["effective_limit"] == {"gpu": 4, "step_run": 32}
    listed = ok(client.get("/policies", params={"pool": "tour-gpus"}))
    assert [p["component"] for p in listed["items"]] == ["tour-orch"]
    # Every list in one shape: an unpaged one's `next` is null (it had none; helper-73).
    assert listed["pagination"] == {"index": 1, "max_size": 1, "total_pages": 1, "total": 1,
                                    "next": None}

    first = submit(client, "tour-orch", gpu=3, step_run=1)
    assert first["status"] == "allocated" and first["pool"] == "tour-gpus"
    second = submit(client, "tour-orch", gpu=2, step_run=1)
    assert second["status"] == "queued"
    assert second["queue"][0]["pool"] == "tour-gpus" and second["queue"][0]["position"] == 1
    assert "gpu" in second["queue"][0]["reason"] and second["status_reason"].startswith("waiting")

    detail = ok(client.get(f"/pools/{pool['id'][:8]}"))
    assert detail["occupied"]["gpu"] == 3 and detail["queue_length"] == 1
    assert [r["id"] for r in detail["queued_requests"]] == [second["id"]]
    assert [r["id"] for r in ok(client.get("/pools/tour-gpus/requests", params={"view": "active"}))["items"]] == [first["id"]]
    assert [r["id"] for r in ok(client.get("/pools/tour-gpus/requests", params={"view": "queued"}))["items"]] == [second["id"]]
    assert ok(client.get(f"/requests/{second['id'][:13]}"))["queue"][0]["position"] == 1
    # A heartbeat answers in any status; a waiter's says where it stands, though no pass ran
    # for it. On PostgreSQL that answer read in a batch whose writes were only collected: 500.
    for _ in range(3):
        assert ok(client.post(f"/requests/{second['id']}/heartbeat")) == ok(
            client.get(f"/requests/{second['id']}"))

    # A long-poll on the waiter returns as soon as a release allocates it.
    result: dict[str, Any] = {}

    def wait() -> None:
        with httpx.Client(base_url=client.base_url, timeout=30.0) as waiter:
            response = waiter.get(f"/requests/{second['id']}/wait", params={"timeout": 20})
            result["at"] = time.monotonic()
            result["body"] = ok(response)

    thread = threading.Thread(target=wait)
    thread.start()
    time.sleep(0.5)
    assert "body" not in result, "the long-poll returned while the request was still queued"
    released_at = time.monotonic()
    assert ok(client.post(f"/requests/{first['id']}/release"))["status"] == "released"
    thread.join(10)
    assert result["body"]["status"] == "allocated"
    latency = result["at"] - released_at
    print(f"long-poll wake latency after release: {latency * 1000:.1f} ms")
    assert latency < 1.0, latency  # the timeout was 20 s

    # A long-poll on a request that is not queued answers at once.
    started = time.monotonic()
    assert ok(client.get(f"/requests/{first['id']}/wait", params={"timeout": 20}))["status"] == "released"
    assert time.monotonic() - started < 1.0

    page = ok(client.get("/requests", params={"component": "tour-orch", "limit": 1}))
    assert page["pagination"] == {"index": 1, "max_size": 1, "total_pages": 2, "total": 2,
                                  "next": page["pagination"]["next"]}
    assert [r["id"] for r in page["items"]] == [first["id"]]
    rest = ok(client.get("/requests", params={"component": "tour-orch", "limit": 1,
                                              "after": page["pagination"]["next"]}))
    assert [r["id"] for r in rest["items"]] == [second["id"]] and rest["pagination"]["next"] is None
    page = ok(client.get("/requests", params={"component": "tour-orch", "limit": 1, "offset": 1}))
    assert page["pagination"]["index"] == 2 and [r["id"] for r in page["items"]] == [second["id"]]
    assert ok(client.get("/requests", params={"status": "allocated", "pool": "tour-gpus"}))["pagination"]["total"] == 1

    assert ok(client.post(f"/requests/{second['id']}/heartbeat"))["status"] == "allocated"
    assert ok(client.post(f"/requests/{second['id']}/cancel"))["status"] == "cancelled"
    summary = ok(client.post("/reconcile"))
    assert set(summary) >= {"granted", "preempted", "rejected", "retried", "expired", "waiting", "seconds"}
    ok(client.delete(f"/requests/{first['id']}"), 204)
    assert client.get(f"/requests/{first['id']}").status_code == 404

    updated = ok(client.patch("/pools/tour-gpus", json={"capacity": {"gpu": 8}, "description": "more"}))
    assert updated["capacity"]["gpu"] == 8 and updated["description"] == "more"
    ok(client.delete("/pools/tour-gpus/policies/tour-orch", params={"component_type": "orchestrator"}), 204)
    ok(client.delete("/pools/tour-gpus"), 204)
    assert client.get("/pools/tour-gpus").status_code == 404


# -- bad input ---------------------------------------------------------------------------


def state(client: httpx.Client) -> Any:
    """Everything a bad request could have changed."""
    pools = ok(client.get("/pools"))["items"]
    policies = ok(client.get("/policies"))["items"]
    requests = ok(client.get("/requests", params={"limit": 10000}))["items"]
    return (
        [(p["id"], p["name"], p["description"], p["capacity"], p["occupied"]) for p in pools],
        [(p["id"], p["priority"], p["reserved"], p["limit"]) for p in policies],
        [(r["id"], r["status"], r["resources"], r["lease_expires_at"]) for r in requests],
    )


ANY = object()


def test_bad_input_is_a_4xx_naming_the_field_and_changes_nothing(
    client: httpx.Client, server: ApiServer
) -> None:
    setup_pool(client, "err-gpus", "err-orch", {"gpu": 2}, reserved={"gpu": 1})
    held = submit(client, "err-orch", gpu=2)
    assert held["status"] == "allocated"
    # Requests until two ids share a first character: an ambiguous prefix.
    rejected = submit(client, "err-orch", gpu=99)["id"]  # rejected at once
    ids = [r["id"] for r in ok(client.get("/requests", params={"limit": 10000}))["items"]]
    while len({i[0] for i in ids}) == len(ids):
        ids.append(submit(client, "err-orch", gpu=99)["id"])
    ambiguous = next(i[0] for i in ids if sum(j[0] == i[0] for j in ids) > 1)
    request = {"component": "err-orch", "resources": {"gpu": 1}}
    before = state(client)

    json_headers = {"content-type": "application/json"}
    big = {**request, "labels": {"x": "y" * 1_100_000}}
    cases: list[tuple[str, str, dict[str, Any], int, object]] = [
        ("POST", "/requests", {"json": {**request, "colour": "red"}}, 422, "colour"),
        ("POST", "/requests", {"json": {**request, "resources": {"gpu": "8"}}}, 422, "resources.gpu"),
        ("POST", "/requests", {"json": {**request, "resources": {"gpu": 1.0}}}, 422, "resources.gpu"),
        ("POST", "/requests", {"json": {**request, "resources": {"gpu": True}}}, 422, "resources.gpu"),
        ("POST", "/requests", {"json": {**request, "resources": {"gpu": -1}}}, 422, "resources.gpu"),
        ("POST", "/requests", {"json": {**request, "resources": {"gpu": 0}}}, 422, "resources.gpu"),
        ("POST", "/requests", {"json": {**request, "resources": {"gpu": 10**13}}}, 422, "resources.gpu"),
        ("POST", "/requests", {"json": {**request, "resources": {"gpu": 10**40}}}, 422, "resources.gpu"),
        ("POST", "/requests", {"json": {**request, "resources": {f"k{i}": 1 for i in range(65)}}}, 422, "resources"),
        ("POST", "/requests", {"json": {**request, "resources": {}}}, 422, "resources"),
        ("POST", "/requests", {"json": {**request, "labels": {f"k{i}": "v" for i in range(65)}}}, 422, "labels"),
        ("POST", "/requests", {"json": {**request, "labels": {"a": 1}}}, 422, "labels.a"),
        ("POST", "/requests", {"json": {**request, "max_retries": "1"}}, 422, "max_retries"),
        ("POST", "/requests", {"json": {**request, "max_retries": -1}}, 422, "max_retries"),
        ("POST", "/requests", {"json": {**request, "lease_ttl": 0}}, 422, "lease_ttl"),
        ("POST", "/requests", {"json": {**request, "lease_ttl": 1.5}}, 422, "lease_ttl"),
        ("POST", "/requests", {"json": {**request, "preemptible": "yes"}}, 422, "preemptible"),
        ("POST", "/requests", {"json": {**request, "component_type": "bogus"}}, 422, "component_type"),
        ("POST", "/requests", {"json": {**request, "component": "x" * 256}}, 422, "component"),
        ("POST", "/requests", {"json": {**request, "component": "a\x00b"}}, 422, "component"),
        ("POST", "/requests", {"json": {**request, "idempotency_key": "a\x00b"}}, 422, "idempotency_key"),
        ("POST", "/requests", {"json": {"resources": {"gpu": 1}}}, 422, "component"),
        ("POST", "/requests", {"json": [request]}, 422, None),
        ("POST", "/requests", {"json": {**request, "component": "nobody"}}, 404, None),
        ("POST", "/requests", {"content": b'{"component": "err-orch", ', "headers": json_headers}, 400, None),
        ("POST", "/requests", {"content": b"\xff\xfe", "headers": json_headers}, 400, None),
        # A lone surrogate in a field the service checks: it reached the store (a 500).
        ("POST", "/workloads", {"content": b'{"instance_type": "\\udcff"}', "headers": json_headers},
         422, "instance_type"),
        ("POST", "/requests", {"content": json.dumps(request).encode()}, 415, None),
        # A content coding: a gzip body was "not UTF-8", a "br" one taken as it came.
        ("POST", "/requests", {"content": gzip.compress(json.dumps(request).encode()),
                               "headers": {**json_headers, "content-encoding": "gzip"}}, 415, None),
        ("POST", "/requests", {"content": json.dumps(request).encode(),
                               "headers": {**json_headers, "content-encoding": "br"}}, 415, None),
        ("POST", "/requests", {"json": big}, 413, None),
        ("POST", "/requests", {"content": iter([b"[" * 600_000, b"]" * 600_000]), "headers": json_headers}, 413, None),
        # Within the size, nested deeper than the parser goes: refused, not a 500.
        ("POST", "/requests", {"content": iter([b"[" * 40_000, b"]" * 40_000]), "headers": json_headers}, 400, None),
        ("POST", "/requests", {"json": {**request, "labels": {"x": "y" * 70_000}}}, 422, "labels.x"),
        ("POST", "/pools", {"json": {"name": "err-gpus", "capacity": {"gpu": 1}}}, 409, None),
        ("POST", "/pools", {"json": {"name": "new", "capacity": {}}}, 422, "capacity"),
        # A key, not a value, is wrong: named as the service names it (was "capacity..[key]").
        ("POST", "/pools", {"json": {"name": "new", "capacity": {"": 1}}}, 422, "capacity key"),
        ("POST", "/requests", {"json": {**request, "labels": {"a\x00": "v"}}}, 422, "labels key"),
        # Names print as themselves (the service's rule, in its words).
        ("POST", "/pools", {"json": {"name": "new\x1b[2J", "capacity": {"gpu": 1}}}, 422, "name"),
        ("POST", "/requests", {"json": {**request, "labels": {"a\n": "v"}}}, 422, "labels key"),
        ("POST", "/pools", {"json": {"name": "new", "capacity": {"gpu": 1}, "extra": 1}}, 422, "extra"),
        ("POST", "/pools", {"json": {"name": 5, "capacity": {"gpu": 1}}}, 422, "name"),
        ("POST", "/pools", {"json": {"name": "", "capacity": {"gpu": 1}}}, 422, "name"),
        ("PATCH", "/pools/err-gpus", {"json": {"capacity": {"gpu": -1}}}, 422, "capacity.gpu"),
        ("PATCH", "/pools/err-gpus", {"json": {"capacity": {"gpu": "2"}}}, 422, "capacity.gpu"),
        ("PATCH", "/pools/nope", {"json": {"description": "x"}}, 404, None),
        ("POST", "/pools/err-gpus/policies", {"json": {"component": "other", "reserved": {"tpu": 1}}}, 422, "reserved.tpu"),
        ("POST", "/pools/err-gpus/policies", {"json": {"component": "other", "priority": -1}}, 422, "priority"),
        ("POST", "/pools/err-gpus/policies", {"json": {"component": "err-orch"}}, 409, None),
        ("PATCH", "/pools/err-gpus/policies/err-orch", {"json": {"priority": "1"}}, 422, "priority"),
        ("PATCH", "/pools/err-gpus/policies/err-orch", {"json": {"reserved": {"gpu": -1}}}, 422, "reserved.gpu"),
        ("PATCH", "/pools/err-gpus/policies/err-orch", {"json": {"limit": {"tpu": 1}}}, 422, "limit.tpu"),
        ("PATCH", "/pools/err-gpus/policies/err-orch", {"json": {}}, 422, "policy"),
        ("PATCH", "/pools/err-gpus/policies/err-orch", {"json": {"weight": 1}}, 422, "weight"),
        ("PATCH", "/pools/err-gpus/policies/nobody", {"json": {"priority": 1}}, 404, None),
        # Options are any JSON, but no text in them, at any depth, may hold a NUL.
        ("POST", "/pool-trees", {"json": {"name": "t", "config": {"pool_config_presets": {"p": {"a\x00": 1}}}}}, 422, "config"),
        ("POST", "/pool-trees", {"json": {"name": "t", "config": {"x": [[{"y": "a\x00"}]]}}}, 422, "config"),
        ("DELETE", "/pools/err-gpus", {}, 409, None),
        ("DELETE", "/pools/err-gpus/policies/err-orch", {}, 409, None),
        ("DELETE", "/pools/err-gpus/policies/nobody", {}, 404, None),
        ("DELETE", "/pools/err-gpus/policies/err-orch", {"params": {"component_type": "x"}}, 422, "component_type"),
        ("GET", "/pools/nope", {}, 404, None),
        ("GET", "/requests/00000000-0000-4000-8000-000000000000", {}, 404, None),
        ("GET", f"/requests/{ambiguous}", {}, 409, None),
        ("GET", f"/requests/{ambiguous}/wait", {}, 409, None),
        ("GET", "/requests/%00", {}, 422, "ref"),
        ("GET", "/requests", {"params": {"status": "bogus"}}, 422, "status"),
        ("GET", "/requests", {"params": {"limit": 0}}, 422, "limit"),
        ("GET", "/requests", {"params": {"limit": "ten"}}, 422, "limit"),
        # An integer in a URL is its decimal digits, nothing else pydantic would take.
        *(("GET", "/requests", {"params": {"limit": bad}}, 422, "limit")
          for bad in ("+4", " 4", "04", "4_0", "4.0", "")),
        ("GET", "/requests", {"params": {"offset": "+1"}}, 422, "offset"),
        ("GET", "/config", {"params": {"version": "+1"}}, 422, "version"),
        ("GET", "/config/versions/+1/diff", {}, 422, "version"),
        ("GET", "/requests", {"params": {"pool": "nope"}}, 404, None),
        *(("GET", path, {"params": {"limit": bad}}, 422, "limit")
          for path in ("/workloads", "/operations") for bad in (0, 10_001, "4.0")),
        ("GET", "/operations", {"params": {"offset": -1}}, 422, "offset"),
        # Only what a page's `next` was is a cursor; it is never longer than a name.
        *(("GET", path, {"params": {"after": bad}}, 422, "after")
          for path in ("/requests", "/workloads", "/operations")
          for bad in ("x", "MjAyNg", "", "a" * 256)),
        ("POST", "/prune", {"json": {}}, 422, "older_than"),
        ("POST", "/prune", {"json": {"older_than": -1}}, 422, "older_than"),
        ("POST", "/prune", {"json": {"older_than": "30d"}}, 422, "older_than"),
        ("POST", "/prune", {"json": {"older_than": 100 * 365 * 86400 + 1}}, 422, "older_than"),
        ("POST", "/prune", {"json": {"older_than": 0, "dry_run": "yes"}}, 422, "dry_run"),
        ("POST", "/prune", {"json": {"older_than": 0, "batches": 0}}, 422, "batches"),
        ("POST", "/prune", {"json": {"older_than": 0, "batches": 21}}, 422, "batches"),
        # A query parameter a route does not take, or one given twice, is not ignored.
        ("GET", "/requests", {"params": {"page": 2}}, 422, "page"),
        ("GET", "/requests", {"params": [("status", "queued"), ("status", "allocated")]}, 422, "status"),
        ("GET", "/pools", {"params": {"limit": 1}}, 422, "limit"),
        ("POST", "/requests", {"json": request, "params": {"dry_run": 1}}, 422, "dry_run"),
        ("GET", f"/requests/{held['id']}/wait", {"params": {"timeout": 0, "wait": 1}}, 422, "wait"),
        ("GET", "/config/versions", {"params": {"version": 1}}, 422, "version"),
        ("GET", "/pool-trees", {"params": {"x": ""}}, 422, "x"),
        # Nested past Python's recursion limit (PyYAML composes recursively): a 500 until
        # the service refused it.
        ("POST", "/pool-trees/apply", {"json": {"document": "[" * 1000}}, 422, "tree"),
        # A scalar PyYAML's constructors could not build (a ValueError, not a YAMLError): a
        # 500. Dates are text now: refused as text, at its field.
        ("POST", "/pool-trees/apply", {"json": {
            "document": "name: u3\nconfig: {max_operation_count: 2024-13-45}"}}, 422,
         "config.max_operation_count"),
        # Characters YAML does not take: the loader refuses them as it starts (a 500).
        ("POST", "/pool-trees/apply", {"json": {"document": "a: \x9a"}}, 422, "tree"),
        # A lone surrogate a YAML escape makes, in the field an error names: its answer
        # could not be encoded (a 500). Escaped, as a terminal shows it.
        ("POST", "/pool-trees/apply", {"json": {
            "document": 'name: u5\npools: {"p\\uD800": {}}\n'}}, 422, "pools.p\\ud800"),
        # So did the tag formula's parser, within the 1,024 characters a value may have.
        ("POST", "/pool-trees", {"json": {"name": "u2", "config": {
            "node_tag_filter": "(" * 400 + "gpu" + ")" * 400}}}, 422, "config.node_tag_filter"),
        ("GET", "/pools/err-gpus/requests", {"params": {"view": "some"}}, 422, "view"),
        ("GET", f"/requests/{held['id']}/wait", {"params": {"timeout": -1}}, 422, "timeout"),
        ("GET", f"/requests/{held['id']}/wait", {"params": {"timeout": "nan"}}, 422, "timeout"),
        *(("GET", f"/requests/{held['id']}/wait", {"params": {"timeout": bad}}, 422, "timeout")
          for bad in ("+0.1", " 0.1", "1_0", ".5", "inf")),
        ("POST", f"/requests/{rejected}/release", {}, 409, None),
        ("POST", f"/requests/{rejected}/cancel", {}, 409, None),
        ("PUT", "/pools/err-gpus", {"json": {}}, 405, None),
        ("GET", "/nowhere", {}, 404, None),
    ]
    for method, path, kwargs, status, field in cases:
        response = client.request(method, path, **kwargs)
        where = f"{method} {path} {kwargs}"[:200]
        assert response.status_code == status, f"{where}: {response.status_code} {response.text[:300]}"
        body = response.json()
        assert set(body) == {"detail", "field"}, where
        assert isinstance(body["detail"], str) and body["detail"] and "\n" not in body["detail"], where
        if field is not ANY:
            assert body["field"] == field, f"{where}: {body}"
    assert state(client) == before
    assert "Traceback" not in server.log_path.read_text()


def test_a_value_no_member_of_a_union_takes_is_one_error_for_its_field(
    client: httpx.Client,
) -> None:
    """pydantic fails such a value once per member, located at (field, member): it was
    "resources.cpu.int: ... (and 2 more errors)". Now the field, in the service's words."""
    for path, body, detail in (
        ("/nodes", {"name": "u1", "resources": {"cpu": True}},
         "resources.cpu: must be an integer (got true)"),
        # pydantic's own words before 2026-11-30 ("Input should be a valid list").
        ("/nodes", {"name": "u1", "tags": "gpu", "resources": {"cpu": 1}},
         "tags: must be a list (got 'gpu')"),
        ("/operations", {"user": "u1", "job_resources": {"cpu": 1}, "job_count": 1,
                         "weight": "9" * 100},
         "weight: must be a number written in at most 64 characters (got '99999999999999999999...')"),
        # Text in an option's value: its length is the service's to check, as embedded.
        ("/pool-trees", {"name": "u1", "config": {"node_tag_filter": "f" * 5000}},
         "config.node_tag_filter: must be at most 4096 characters (got 'ffffffffffffffffffff...')"),
        # Not a union: two fields, each its own error.
        ("/pools", {"name": "u1", "capacity": {"gpu": -1, "tpu": -1}},
         "capacity.gpu: must be a positive integer (got -1) (and 1 more error)"),
        # JSON's Infinity, which Python writes for inf: the weight's own words, not an
        # integer's (the union's first member), as the command line says it.
        ("/operations", {"user": "u1", "job_resources": {"cpu": 1}, "job_count": 1,
                         "weight": math.inf},
         "weight: must be a finite number between 1e-30 and 1e30 in magnitude (got inf)"),
    ):
        response = client.post(path, content=json.dumps(body),
                               headers={"content-type": "application/json"})
        assert response.status_code == 422, response.text
        assert response.json()["detail"] == detail


def test_a_workload_demand_is_read_as_its_json_writes_it(client: httpx.Client) -> None:
    """A float reads 1.5e-400 as 0: such a workload was admitted with no demand at all
    (helper-101), and 1e400 was "not finite". Read as written, each is refused as the CLI
    refuses the same text, and nothing is stored."""
    before = client.get("/workloads").json()["pagination"]["total"]
    for written, detail in (
        ("1.5e-400", "demand.gpu: must have at most 3 decimal places (got 1.5E-400)"),
        ("1e400", "demand.gpu: must be at most 1000000000000 (got 1E+400)"),
        ("-0.0", "demand.gpu: must be >= 0, unsigned (got -0.0)"),
    ):
        for path in ("/workloads", "/config/explain"):
            response = client.post(path, content=f'{{"demand": {{"gpu": {written}}}}}',
                                   headers={"content-type": "application/json"})
            assert response.status_code == 422, response.text
            assert response.json()["detail"] == detail
    assert client.get("/workloads").json()["pagination"]["total"] == before


def test_a_url_number_out_of_bounds_is_shown_as_the_number(client: httpx.Client) -> None:
    """A URL's values are text, but an integer or a number out of its bounds is shown as the
    number it is, as the embedded CLI and the SDK show it (the remote CLI prints this)."""
    for path, params, detail in (
        ("/requests", {"limit": 0}, "limit: must be a positive integer (got 0)"),
        ("/config", {"version": "-1"}, "version: must be a positive integer (got -1)"),
        ("/config/versions/99999999999999999999/diff", {},
         "version: must be at most 2147483647 (got 99999999999999999999)"),
        ("/requests/x/wait", {"timeout": "-1.5"}, "timeout: must be >= 0 (got -1.5)"),
        # A number written without a fraction is still a number, not an integer.
        ("/requests/x/wait", {"timeout": "-1"}, "timeout: must be >= 0 (got -1)"),
        ("/requests", {"limit": "ten"}, "limit: must be an integer in decimal digits (got 'ten')"),
        # Past Python's 4,300 digits, and past a float's range: pydantic's words were its own.
        ("/requests", {"offset": "9" * 5000},
         "offset: is too large to read (got '99999999999999999999...')"),
        ("/requests/x/wait", {"timeout": "9" * 400},
         "timeout: must be a finite number (got '99999999999999999999...')"),
    ):
        response = client.get(path, params=params)
        assert response.status_code == 422, response.text
        assert response.json()["detail"] == detail


@pytest.mark.parametrize(
    ("kinds", "bad", "at_least"),
    [
        # limit, offset, timeout and three versions today
        ({"integer", "number"}, "+1", 6),
        # every ref and name in a path, every filter; PostgreSQL refuses NUL in text, so
        # unguarded, one reached the database as a 500 (GET /workloads?queue=%00)
        ({"string"}, "a\x00b", 30),
    ],
    ids=["number written as JSON writes it", "string without NUL"],
)
def test_every_url_parameter_refuses_what_its_type_does_not_allow(
    client: httpx.Client, server: ApiServer, kinds: set[str], bad: str, at_least: int
) -> None:
    """Each query or path parameter of the schema's ``kinds`` refuses ``bad`` with a 422
    naming itself: a number "+1", which pydantic alone would take (``UrlInt``,
    ``UrlNumber``); a string a NUL character (``text``). The table is the OpenAPI document,
    so a parameter added without its guard fails here."""
    schema = ok(httpx.get(server.url + "/openapi.json"))
    checked = []
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            parameters = operation.get("parameters", [])
            for parameter in parameters:
                types = {s.get("type") for s in [parameter["schema"],
                                                  *parameter["schema"].get("anyOf", [])]}
                if not types & kinds or parameter["in"] == "header":  # a header: no NUL
                    continue
                url = path.removeprefix(API)
                for other in parameters:  # the other path parameters: any value
                    if other["in"] == "path":
                        value = quote(bad, safe="") if other is parameter else "1"
                        url = url.replace("{" + other["name"] + "}", value)
                query = {parameter["name"]: bad} if parameter["in"] == "query" else {}
                response = client.request(method.upper(), url, params=query)
                assert response.status_code == 422, (method, url, query, response.text)
                assert response.json()["field"] == parameter["name"], (method, url, query)
                checked.append((method, path, parameter["name"]))
    assert len(checked) >= at_least, checked


# -- operations --------------------------------------------------------------------------


def test_health_readiness_metrics_and_docs(client: httpx.Client, server: ApiServer) -> None:
    setup_pool(client, "metrics-gpus", "metrics-orch", {"gpu": 2})
    holder = submit(client, "metrics-orch", gpu=2)
    waiter = submit(client, "metrics-orch", gpu=1)
    assert (holder["status"], waiter["status"]) == ("allocated", "queued")

    assert ok(httpx.get(server.url + "/healthz")) == {"status": "ok"}
    assert ok(httpx.get(server.url + "/readyz")) == {"status": "ready"}
    assert ok(client.get("/healthz")) == {"status": "ok"}
    for path in ("/healthz", "/readyz", "/metrics"):  # 405 before: some checkers use HEAD
        head = httpx.head(server.url + path)
        assert (head.status_code, head.content) == (200, b""), path
    # Out of the schema: there it shared its GET's operation id, which then varied by run.
    schema = ok(httpx.get(server.url + "/openapi.json"))
    operations = [operation["operationId"]
                  for methods in schema["paths"].values() for operation in methods.values()]
    assert len(operations) == len(set(operations))
    # Without auth every API route may answer 403 (another site's request) and 415 (a body
    # not sent as JSON): the schema left both out (helper-73).
    for path, methods in schema["paths"].items():
        for operation in methods.values():
            if path.startswith("/api/v1/"):
                assert {"403", "415"} <= set(operation["responses"]), path
    assert not [o for o in operations if o.endswith("_head")]

    def scrape() -> dict[str, list[Any]]:
        response = httpx.get(server.url + "/metrics")
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
        return {f.name: f.samples for f in text_string_to_metric_families(response.text)}

    def value(metrics: dict[str, list[Any]], family: str, sample: str, **labels: str) -> float:
        found = [s.value for s in metrics[family] if s.name == sample and s.labels == labels]
        assert len(found) == 1, (family, sample, labels, metrics.get(family))
        return float(found[0])

    metrics = scrape()
    assert value(metrics, "fairpool_pool_queue_length", "fairpool_pool_queue_length", pool="metrics-gpus") == 1
    assert value(metrics, "fairpool_pool_capacity_units", "fairpool_pool_capacity_units", pool="metrics-gpus", key="gpu") == 2
    assert value(metrics, "fairpool_pool_allocated_units", "fairpool_pool_allocated_units", pool="metrics-gpus", key="gpu") == 2
    assert value(metrics, "fairpool_pool_free_units", "fairpool_pool_free_units", pool="metrics-gpus", key="gpu") == 0
    assert value(metrics, "fairpool_database_up", "fairpool_database_up") == 1
    admitted = value(metrics, "fairpool_admissions", "fairpool_admissions_total")
    waits = value(metrics, "fairpool_wait_seconds", "fairpool_wait_seconds_count")
    assert admitted >= 1 and waits >= 1
    assert value(metrics, "fairpool_reconcile_pass_seconds", "fairpool_reconcile_pass_seconds_count") >= 1
    for counter in ("fairpool_rejections", "fairpool_preemptions", "fairpool_lease_expiries"):
        assert value(metrics, counter, counter + "_total") >= 0
    # Every labelled counter's series from the start; no *_created series (a gauge each).
    for kind in ("requests", "events", "workloads", "operations"):
        assert value(metrics, "fairpool_pruned", "fairpool_pruned_total", kind=kind) >= 0
    for on in ("loop", "thread"):
        assert value(metrics, "fairpool_write_batches", "fairpool_write_batches_total", on=on) >= 0
    assert not [s.name for samples in metrics.values() for s in samples
                if s.name.endswith("_created")]
    # docs/service.md's table names every family, and only those.
    table = (Path(__file__).parents[1] / "docs" / "service.md").read_text().split("\n## Metrics\n", 1)[1]
    documented = {name.removesuffix("_total")
                  for name in re.findall(r"^\| `(fairpool_\w+)` \|", table, re.M)}
    assert documented == set(metrics)

    ok(client.post(f"/requests/{holder['id']}/release"))  # the waiter is allocated by this pass
    metrics = scrape()
    assert value(metrics, "fairpool_admissions", "fairpool_admissions_total") == admitted + 1
    assert value(metrics, "fairpool_wait_seconds", "fairpool_wait_seconds_count") == waits + 1
    assert value(metrics, "fairpool_pool_queue_length", "fairpool_pool_queue_length", pool="metrics-gpus") == 0
    assert value(metrics, "fairpool_pool_allocated_units", "fairpool_pool_allocated_units", pool="metrics-gpus", key="gpu") == 1
    rejected = value(metrics, "fairpool_rejections", "fairpool_rejections_total")
    assert submit(client, "metrics-orch", gpu=3)["status"] == "rejected"
    assert value(scrape(), "fairpool_rejections", "fairpool_rejections_total") == rejected + 1
    ok(client.post(f"/requests/{waiter['id']}/release"))

    # A preemption, then a lease that expires: each counted once.
    ok(client.post("/pools/metrics-gpus/policies", json={"component": "metrics-boss", "priority": 9}), 201)
    metrics = scrape()
    preempted = value(metrics, "fairpool_preemptions", "fairpool_preemptions_total")
    expired = value(metrics, "fairpool_lease_expiries", "fairpool_lease_expiries_total")
    victim = submit(client, "metrics-orch", gpu=2)
    boss = ok(client.post("/requests", json={"component": "metrics-boss", "resources": {"gpu": 2},
                                             "lease_ttl": 1}), 201)
    assert boss["status"] == "allocated"
    assert ok(client.get(f"/requests/{victim['id']}"))["status"] == "preempted"
    assert value(scrape(), "fairpool_preemptions", "fairpool_preemptions_total") == preempted + 1
    poll_until(lambda: ok(client.get(f"/requests/{boss['id']}"))["status"] == "released", 10)
    assert value(scrape(), "fairpool_lease_expiries", "fairpool_lease_expiries_total") == expired + 1

    schema = ok(httpx.get(server.url + "/openapi.json"))
    assert {f"{API}/requests", f"{API}/requests/{{ref}}/wait", f"{API}/pools/{{ref}}/policies", "/metrics"} <= set(schema["paths"])
    docs = httpx.get(server.url + "/docs")
    assert docs.status_code == 200 and "swagger" in docs.text.lower()


# -- HTTP semantics: HEAD, Location, Cache-Control, Idempotency-Key (RFC 9110, 9111) -------


def answered_as_get(get: httpx.Response, head: httpx.Response) -> None:
    """A HEAD answered as its GET: the same status and headers (but the date, and the length
    of an answer that changes from one call to the next), no body."""
    assert head.status_code == get.status_code, (head.request.url, head.status_code, get.text)

    def shown(answer: httpx.Response) -> dict[str, str]:
        return {k: v for k, v in answer.headers.items() if k not in ("date", "content-length")}

    assert shown(head) == shown(get), head.request.url
    assert head.content == b""


def test_every_get_route_answers_head_as_its_get(client: httpx.Client, server: ApiServer) -> None:
    """RFC 9110 9.3.2: a resource that answers GET answers HEAD alike, without the body.
    Only /healthz, /readyz and /metrics did; every other route answered 405. The table is
    the OpenAPI document (its GET routes, each path parameter naming nothing: a 404, or a
    422 for a version), then routes naming what exists (a 200). HEAD stays out of it."""
    setup_pool(client, "head-gpus", "head-orch", {"gpu": 1})
    held = submit(client, "head-orch", gpu=1)
    schema = ok(httpx.get(server.url + "/openapi.json"))
    urls = [re.sub(r"\{[^}]*\}", "nope", path) for path, methods in schema["paths"].items()
            if "get" in methods]
    assert not [path for path, methods in schema["paths"].items() if "head" in methods]
    urls += [f"{API}/pools/head-gpus", f"{API}/requests/{held['id'][:8]}",
             f"{API}/requests/{held['id']}/events", f"{API}/requests/{held['id']}/wait",
             f"{API}/healthz", "/docs"]
    statuses = set()
    for url in urls:
        answered_as_get(httpx.get(server.url + url), head := httpx.head(server.url + url))
        statuses.add(head.status_code)
    assert {200, 204, 404, 422} <= statuses
    # Nothing follows the headers on the wire either.
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw:
        raw.sendall(f"HEAD {API}/pools/head-gpus HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    "Connection: close\r\n\r\n".encode())
        answer = b""
        while chunk := raw.recv(65536):
            answer += chunk
    head, _, rest = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ") and b"content-length: " in head and rest == b""
    # A route that takes GET says it takes HEAD too.
    refused = client.delete("/pools")
    assert (refused.status_code, refused.headers["allow"]) == (405, "GET, HEAD, POST")
    ok(client.post(f"/requests/{held['id']}/release"))


def test_a_create_answers_where_what_it_made_is(client: httpx.Client, server: ApiServer) -> None:
    """RFC 9110 10.2.2: a 201 names what it made in ``Location``, the path its GET route
    answers it at (none did). A policy and a node have no GET route of their own: none."""
    made: dict[str, Any] = {}
    # (what, the create's path, its body, its Location: formatted with what was made so far)
    creates: list[tuple[str, str, Any, str | None]] = [
        ("pool", "/pools", {"name": "where gpus é%", "capacity": {"gpu": 2}},
         "/pools/where%20gpus%20%C3%A9%25"),
        ("policy", "/pools/where%20gpus%20%C3%A9%25/policies", {"component": "where-orch"},
         None),
        ("request", "/requests", {"component": "where-orch", "resources": {"gpu": 1}},
         "/requests/{request[id]}"),
        ("config", "/config", {"document": WHERE_CONFIG},
         "/config?version={config[version][version]}"),
        ("rollback", "/config/versions/{config[version][version]}/rollback", None,
         "/config?version={rollback[version][version]}"),
        ("workload", "/workloads", {"labels": {"team": "where"}, "demand": {"cpu": 1}},
         "/workloads/{workload[id]}"),
        ("node", "/nodes", {"name": "where-n", "tags": ["where"], "resources": {"cpu": 4}},
         None),
        ("tree", "/pool-trees", {"name": "where:t", "config": {"node_tag_filter": "where"}},
         "/pool-trees/where%3At"),
        ("tree pool", "/pool-trees/where:t/pools", {"name": "where:p"},
         "/pool-trees/where%3At/pools/where%3Ap"),
        ("operation", "/operations", {"user": "where-u", "job_resources": {"cpu": 1},
                                      "job_count": 1, "pool_trees": ["where:t"],
                                      "pool": "where:p"},
         "/operations/{operation[id]}"),
    ]
    for what, path, body, location in creates:
        response = client.post(path.format(**made), json=body)
        made[what] = answer = ok(response, 201)
        if location is None:
            assert "location" not in response.headers, what
            continue
        assert response.headers["location"] == API + location.format(**made), what
        found = ok(httpx.get(server.url + response.headers["location"]))
        its = answer["version"] if what in ("config", "rollback") else answer
        assert {k: found[k] for k in ("id", "name", "version") if k in its} == {
            k: its[k] for k in ("id", "name", "version") if k in its}, what
    ok(client.post(f"/requests/{made['request']['id']}/release"))
    ok(client.post(f"/workloads/{made['workload']['id']}/release"))
    ok(client.post(f"/operations/{made['operation']['id']}/complete"))
    ok(client.delete("/pool-trees/where:t"), 204)
    ok(client.delete("/nodes/where-n"), 204)


#: A scheduler config of the tests of HTTP semantics: its queue and rule are no other test's.
WHERE_CONFIG = """\
resource_flavors:
  - name: where-flavor
resource_queues:
  - name: where-q
    resource_groups:
      - covered_resources: [cpu]
        flavors:
          - name: where-flavor
            resources:
              - { name: cpu, nominal_quota: 1000 }
scheduling_rules:
  - selector:
      - { key: team, operator: in, values: [where] }
    resource_queue: where-q
"""


def test_every_api_answer_says_it_is_not_to_be_stored(
    client: httpx.Client, server: ApiServer
) -> None:
    """RFC 9111 5.2.2.5: ``Cache-Control: no-store`` on every answer under /api/v1, success
    or error, whichever layer answered it, so that no cache answers a request's status
    stale (none said so). Outside it (the probes, the schema, the pages) as before."""
    setup_pool(client, "store-gpus", "store-orch", {"gpu": 1000})
    json_body = {"content-type": "application/json"}
    for method, path, options, status, cache_control in [
        ("GET", "/pools", {}, 200, "no-store"),
        ("HEAD", "/pools", {}, 200, "no-store"),
        ("POST", "/requests", {"json": {"component": "store-orch", "resources": {"gpu": 1}}},
         201, "no-store"),
        ("GET", "/requests/nope", {}, 404, "no-store"),
        ("GET", "/requests/nope/wait", {"params": {"timeout": 0}}, 404, "no-store"),  # busy
        ("POST", "/requests/nope/release", {}, 404, "no-store"),
        ("POST", "/pools", {"json": {"name": ""}}, 422, "no-store"),
        ("POST", "/pools", {"content": b"{", "headers": json_body}, 400, "no-store"),
        ("POST", "/pools", {"content": b"{}", "headers": {**json_body,
                                                          "content-encoding": "gzip"}},
         415, "no-store"),
        ("POST", "/pools", {"content": b" " * (2 << 20)}, 413, "no-store"),
        ("POST", "/pools", {"json": {}, "headers": {"origin": "http://evil.example"}}, 403,
         "no-store"),
        ("DELETE", "/pools", {}, 405, "no-store"),
        ("GET", "/nowhere", {}, 404, "no-store"),
        ("GET", "/healthz", {}, 200, "no-store"),
        *(("GET", server.url + path, {}, 200, None)
          for path in ("/healthz", "/readyz", "/metrics", "/openapi.json", "/docs")),
    ]:
        answer = client.request(method, path, **options)
        assert (answer.status_code, answer.headers.get("cache-control")) == (
            status, cache_control), (method, path)


#: What each create that takes an idempotency key asks (the rollback's path: of a version).
KEYED_CREATES = {
    "request": ("/requests", {"component": "keyed-orch", "resources": {"gpu": 1}}),
    "workload": ("/workloads", {"labels": {"team": "where"}, "demand": {"cpu": 1}}),
    "operation": ("/operations", {"user": "keyed-u", "job_resources": {"cpu": 1},
                                  "job_count": 1, "pool_trees": ["keyed-t"]}),
    "config": ("/config", {"document": WHERE_CONFIG}),
    "rollback": ("/config/versions/{version}/rollback", {}),
}
#: (the Idempotency-Key header, the body's idempotency_key, the key that makes, or the
#: 422's detail), ``{k}`` and ``{o}`` two keys of the test's own.
KEYS: list[tuple[str | None, str | None, str | None, str | None]] = [
    ("{k}", None, "{k}", None),  # the header alone
    (None, "{k}", "{k}", None),  # the body alone, as ever
    ("{k}", "{k}", "{k}", None),
    ('"{k}"', "{k}", "{k}", None),  # the draft's form: a Structured Field string
    ('"{k}\\""', '{k}"', '{k}"', None),  # with an escape
    ("{k}", "{o}", None, "Idempotency-Key: differs from the body's idempotency_key '{o}': "
                         "give the key once, or the same in both (got '{k}')"),
    ("x" * 65, None, None, f"Idempotency-Key: must be at most 64 characters (got '{'x' * 20}...')"),
    ('"' + "x" * 65 + '"', None, None,
     f"Idempotency-Key: must be at most 64 characters (got '{'x' * 20}...')"),
    ("", None, None, "Idempotency-Key: must be a non-empty string (got '')"),
    ('"{k}"{k}"', None, None, "Idempotency-Key: must be a key, or one in quotes with only "
                              '\\" and \\\\ escaped (got \'"{k}"{k}"\')'),
    ("a\tb", None, None, "Idempotency-Key: must not contain control or other non-printing "
                        "characters (got 'a\\tb', with U+0009)"),
]


@pytest.mark.parametrize("what", KEYED_CREATES)
def test_the_idempotency_key_header_stands_for_the_bodys_key(
    client: httpx.Client, what: str
) -> None:
    """draft-ietf-httpapi-idempotency-key-header: a create's key in an ``Idempotency-Key``
    header (it was ignored), checked as the body's ``idempotency_key`` is, the two the same
    if both are given. The key made what it made, whichever carried it: asked again by the
    header alone, that answers."""
    if what == "request":
        setup_pool(client, "keyed-gpus", "keyed-orch", {"gpu": 1000})
    elif what == "operation":
        ok(client.post("/nodes", json={"name": "keyed-n", "tags": ["keyed"],
                                       "resources": {"cpu": 1000}}), 201)
        ok(client.post("/pool-trees", json={"name": "keyed-t",
                                            "config": {"node_tag_filter": "keyed"}}), 201)
    version = ok(client.post("/config", json={"document": WHERE_CONFIG}), 201)["version"]
    path, body = KEYED_CREATES[what]
    path = path.format(version=version["version"])

    def create(header: str | None, key: str | None = None) -> httpx.Response:
        headers = {} if header is None else {"Idempotency-Key": header}
        return client.post(path, json=body if key is None else {**body, "idempotency_key": key},
                           headers=headers)

    def made(answer: httpx.Response) -> Any:
        it = ok(answer, 201)
        return it["version"]["version"] if what in ("config", "rollback") else it["id"]

    for n, (header, key, makes, refused) in enumerate(KEYS):
        own = {"k": f"{what}-{n}-{uuid.uuid4().hex[:8]}", "o": f"other-{n}"}
        header, key, makes, refused = (
            None if text is None else text.format(**own) for text in (header, key, makes, refused))
        answer = create(header, key)
        if refused is not None:
            assert answer.json() == {"detail": refused, "field": "Idempotency-Key"}, (header, key)
            assert answer.status_code == 422
            continue
        first = made(answer)
        assert made(create(makes)) == first, (header, key)
        assert made(create(None)) != first  # without a key: another


def test_the_schema_describes_answers_and_bounds_as_json_schema(server: ApiServer) -> None:
    """Every answer's schema was ``{}``, so a generated client knew no field of any, and a
    URL number's bounds were written ``ge`` and ``le``, which JSON Schema has not (helper-96);
    the config, workload, queue and tree routes' answers were still ``{}`` after that. That
    the answers match these schemas, tests/test_schemathesis.py and the test below check."""
    schema = ok(httpx.get(server.url + "/openapi.json"))
    described = {}
    for path, methods in schema["paths"].items():
        for method, operation in methods.items():
            for status, answer in operation["responses"].items():
                body = answer.get("content", {}).get("application/json", {}).get("schema")
                if status.startswith("2") and body:
                    described[f"{method.upper()} {path.removeprefix(API)}"] = body.get("$ref")
    assert described["GET /requests/{ref}"] == described["POST /requests"] == (
        "#/components/schemas/RequestView")
    assert {described[route].rsplit("/", 1)[1] for route in (
        "GET /pools", "GET /requests", "GET /policies", "GET /components", "GET /pools/{ref}",
        "PATCH /pools/{ref}/policies/{component}", "POST /reconcile", "POST /prune")} == {
        "Listed_PoolView_", "Listed_RequestView_", "Listed_PolicyView_",
        "Listed_ComponentView_", "PoolView", "PolicyView", "PassSummary", "PruneView"}
    request = schema["components"]["schemas"]["RequestView"]
    assert {"id", "status", "resources", "queue", "lease_expires_at"} <= set(request["properties"])
    parameters = [parameter["schema"] for methods in schema["paths"].values()
                  for operation in methods.values() for parameter in operation.get("parameters", [])]
    assert not [p for p in parameters if {"ge", "le"} & set(p)]
    limit = next(p for p in schema["paths"][f"{API}/requests"]["get"]["parameters"]
                 if p["name"] == "limit")["schema"]
    assert (limit["minimum"], limit["maximum"]) == (1, 10_000)
    # The config, workload, queue and tree routes' answers were still `{}`: every 2xx JSON
    # answer under /api/v1 is described now (their fields checked against live answers by
    # the test below).
    undescribed = [f"{method.upper()} {path} {status}"
                   for path, methods in schema["paths"].items() if path.startswith(API)
                   for method, operation in methods.items()
                   for status, answer in operation["responses"].items()
                   if status.startswith("2") and status != "204"
                   and not answer.get("content", {}).get("application/json", {}).get("schema")]
    assert undescribed == []
    components = schema["components"]["schemas"]

    def properties(ref: str) -> dict[str, Any]:
        found: dict[str, Any] = components[ref.rsplit("/", 1)[1]]["properties"]
        return found

    def required(ref: str) -> set[str]:
        return set(components[ref.rsplit("/", 1)[1]].get("required", []))

    workload = described["POST /workloads"]
    assert workload == described["GET /workloads/{ref}"] == described[
        "POST /workloads/{ref}/cancel"]
    assert {"id", "status", "queue", "flavors", "demand", "position"} <= set(properties(workload))
    assert properties(described["GET /workloads"])["items"]["items"]["$ref"] == workload
    usage = properties(described["GET /queues/{name}"])["usage"]["items"]["$ref"]
    assert properties(usage) == {
        "flavor": {"anyOf": [{"type": "string"}, {"type": "null"}], "title": "Flavor"},
        "resource": {"type": "string", "title": "Resource"},
        "used": {"type": "string", "title": "Used"},
        "nominal_quota": {"anyOf": [{"type": "string"}, {"type": "null"}],
                          "title": "Nominal Quota"},
        "workloads": {"type": "integer", "title": "Workloads"},
    }
    version = described["GET /config"]
    assert properties(described["POST /config"])["version"]["$ref"] == version
    assert properties(described["POST /config/versions/{version}/rollback"])["version"][
        "$ref"] == version
    assert properties(version)["document"]["anyOf"] == [{"type": "string"}, {"type": "null"}]
    assert {"version", "applied_at", "active", "rolled_back_from"} <= required(version)
    issue = properties(described["POST /config/preview"])["warnings"]["items"]["$ref"]
    assert set(properties(issue)) == {"path", "message", "line"} and "line" not in required(issue)
    assert set(properties(described["GET /config/versions/{version}/diff"])) == {
        "version", "changes"}
    tree = described["GET /pool-trees/{name}"]
    assert tree == described["POST /pool-trees"] == described["PATCH /pool-trees/{name}"]
    element = properties(tree)["elements"]["items"]["$ref"]
    assert {"name", "kind", "depth", "fair_share", "starving", "status"} <= required(element)
    pool = described["GET /pool-trees/{tree}/pools/{name}"]
    assert {"effective", "children", "fair_share", "dominant_resource"} <= required(pool)
    operation = described["GET /operations/{ref}"]
    assert operation == described["POST /operations"] == described["POST /operations/{ref}/abort"]
    assert {"id", "status", "trees", "preempted", "created_at", "fair_share"} <= set(
        properties(operation))
    # Its shares only while it runs in one tree (and not in lists): never required.
    assert "fair_share" not in required(operation) and "created_at" in required(operation)
    assert properties(described["GET /default-tree"])["default_tree"]["anyOf"] == [
        {"type": "string"}, {"type": "null"}]


#: A scheduler config of the answers' test: its queue and rule are no other test's.
ANSWERS_CONFIG = """\
resource_flavors:
  - name: answers-flavor
resource_queues:
  - name: answers-q
    resource_groups:
      - covered_resources: [cpu]
        flavors:
          - name: answers-flavor
            resources:
              - { name: cpu, nominal_quota: 2 }
  - name: answers-rest
scheduling_rules:
  - selector:
      - { key: team, operator: in, values: [answers] }
    resource_queue: answers-q
  - resource_queue: answers-rest
"""


def test_config_workload_and_tree_answers_are_what_their_schemas_describe(
    server: ApiServer, client: httpx.Client
) -> None:
    """Each route of the scheduler config, workloads, queues, nodes, pool trees and
    operations, called with state behind it, answers what its schema describes: every
    property there is described (none other), every required one there, each of its type
    and nullable as written. The fuzzer (tests/test_schemathesis.py) reaches few of them
    with valid state."""
    import jsonschema_rs

    schema = ok(httpx.get(server.url + "/openapi.json"))
    # Exactly: a property the schema does not name (a view's flattened shares) is an error.
    components = {name: {"additionalProperties": False, **component}
                  if "properties" in component else component
                  for name, component in schema["components"]["schemas"].items()}
    checked: set[str] = set()

    def call(method: str, route: str, status: int = 200, body: Any = None,
             params: dict[str, Any] | None = None, **names: str) -> Any:
        answer = ok(client.request(method, route.format(**names), json=body, params=params),
                    status)
        described = schema["paths"][API + route][method.lower()]["responses"][str(status)]
        body_schema = described["content"]["application/json"]["schema"]
        assert body_schema, (method, route)  # `{}` takes anything
        validator = jsonschema_rs.validator_for(
            {**body_schema, "components": {"schemas": components}},
            validate_formats=True,
        )
        errors = [f"{list(error.instance_path)}: {error.message}"
                  for error in validator.iter_errors(answer)]
        assert errors == [], (method, route, errors)
        checked.add(f"{method} {route}")
        return answer

    # -- the scheduler config, workloads, queues
    without_catch_all = ANSWERS_CONFIG.replace("  - resource_queue: answers-rest\n", "")
    valid = call("POST", "/config/validate", body={"document": without_catch_all})
    assert valid["warnings"] and valid["errors"] == []
    preview = call("POST", "/config/preview", body={"document": ANSWERS_CONFIG})
    applied = call("POST", "/config", 201, body={"document": ANSWERS_CONFIG,
                                                  "based_on": preview["based_on"]})
    version = applied["version"]["version"]
    assert call("GET", "/config")["document"] == ANSWERS_CONFIG
    assert call("GET", "/config", params={"version": version})["version"] == version
    assert call("GET", "/config/versions")["items"][0]["document"] is None
    assert call("GET", "/config/versions/{version}/diff", version=str(version))["changes"] == []
    again = call("POST", "/config/versions/{version}/rollback", 201, version=str(version))
    assert again["version"]["rolled_back_from"] == version
    team = {"labels": {"team": "answers"}, "demand": {"cpu": 1}}
    assert call("POST", "/config/explain", body=team)["queue"] == "answers-q"
    submitted = [call("POST", "/workloads", 201, body=team) for _ in range(3)]
    assert [w["status"] for w in submitted] == ["admitted", "admitted", "queued"]
    assert submitted[2]["position"] == 1
    call("POST", "/workloads", 201, body={"demand": {"cpu": 1}})  # the passthrough queue's
    listed = call("GET", "/workloads", params={"queue": "answers-q"})
    assert [w["id"] for w in listed["items"]] == [w["id"] for w in submitted]
    call("GET", "/workloads/{ref}", ref=submitted[0]["id"][:8])
    assert call("POST", "/workloads/{ref}/release", ref=submitted[0]["id"])["status"] == (
        "finished")
    call("POST", "/workloads/{ref}/cancel", body={"reason": "enough"}, ref=submitted[2]["id"])
    queues = {q["name"]: q for q in call("GET", "/queues")["items"]}
    assert queues["answers-q"]["usage"][0]["nominal_quota"] == "2"
    assert call("GET", "/queues/{name}", name="answers-q")["usage"][0]["used"] == "1"
    call("GET", "/queues/{name}", name="answers-rest")

    # -- nodes, a pool tree, its pools, operations
    call("POST", "/nodes", 201, body={"name": "answers-n1", "tags": ["answers"],
                                      "resources": {"cpu": 4, "memory": "16GiB"}})
    assert "answers-n1" in [n["name"] for n in call("GET", "/nodes")["items"]]
    call("POST", "/pool-trees", 201, body={"name": "answers-t",
                                           "config": {"node_tag_filter": "answers"}})
    assert "answers-t" in [t["name"] for t in call("GET", "/pool-trees")["items"]]
    call("PUT", "/default-tree", body={"name": "answers-t"})
    assert call("GET", "/default-tree") == {"default_tree": "answers-t"}
    call("POST", "/pool-trees/{tree}/pools", 201, body={"name": "answers-p",
                                                         "config": {"weight": 2}},
         tree="answers-t")
    call("PATCH", "/pool-trees/{tree}/pools/{name}", body={"option": "weight", "value": "3"},
         tree="answers-t", name="answers-p")
    call("PATCH", "/pool-trees/{name}", body={"option": "fair_share_starvation_timeout",
                                              "value": "1000"}, name="answers-t")
    started = call("POST", "/operations", 201, body={
        "user": "answers-u", "job_resources": {"cpu": 1}, "job_count": 6,
        "pool_trees": ["answers-t"], "pool": "answers-p"})
    assert (started["running_jobs"], started["pending_jobs"]) == (4, 2)
    assert "fair_share" in started  # live in one tree: its shares
    waiting = call("POST", "/operations", 201, body={  # in an ephemeral pool
        "user": "answers-v", "job_resources": {"cpu": 1}, "job_count": 1})
    assert waiting["tree"] == "answers-t"
    assert call("GET", "/pool-trees/{tree}/pools/{name}", tree="answers-t",
                name="answers-p")["running_operation_count"] == 1
    shown = call("GET", "/pool-trees/{name}", name="answers-t")
    assert {e["kind"] for e in shown["elements"]} == {"root", "pool", "operation"}
    call("POST", "/pool-trees/{name}/reconcile", name="answers-t")
    document = call("GET", "/pool-trees/{name}/document", name="answers-t")
    assert document["config"] == {"node_tag_filter": "answers",
                                  "fair_share_starvation_timeout": 1000}
    assert call("POST", "/pool-trees/apply", body={"document": json.dumps(document)}) == {
        "tree": "answers-t", "changes": []}
    operations = call("GET", "/operations", params={"tree": "answers-t"})["items"]
    assert [o["id"] for o in operations] == [started["id"], waiting["id"]]
    assert call("GET", "/operations/{ref}", ref=started["id"][:8])["id"] == started["id"]
    call("POST", "/operations/{ref}/complete", ref=started["id"])
    call("POST", "/operations/{ref}/abort", ref=waiting["id"])
    assert "fair_share" not in call("GET", "/operations/{ref}", ref=waiting["id"])  # ended
    ok(client.delete("/pool-trees/answers-t"), 204)
    ok(client.delete("/nodes/answers-n1"), 204)

    # Every such route was asked.
    kinds = {"scheduler config", "workloads", "queues", "nodes", "pool trees",
             "operations of pool trees"}
    assert checked == {
        f"{method.upper()} {path.removeprefix(API)}" for path, methods in schema["paths"].items()
        for method, operation in methods.items() if kinds & set(operation["tags"])
        and any(s.startswith("2") and s != "204" for s in operation["responses"])}


def test_every_list_route_answers_the_page_shape(server: ApiServer, client: httpx.Client) -> None:
    """docs/service.md: `{"items", "pagination"}` is "the shape of every list". Four answered
    `{"items"}` alone: queues, config versions, nodes, pool trees (helper-83). Every GET
    route of the schema without a path parameter that lists items is asked here."""
    schema = ok(httpx.get(server.url + "/openapi.json"))
    lists = []
    for path, methods in schema["paths"].items():
        if "get" not in methods or "{" in path or not path.startswith(API):
            continue
        answer = client.get(path.removeprefix(API))
        if answer.status_code == 200 and isinstance(answer.json(), dict) and (
                "items" in answer.json()):
            lists.append(path.removeprefix(API))
            pagination = answer.json().get("pagination") or {}
            assert set(pagination) == {"index", "max_size", "total_pages", "total", "next"}, path
    assert {"/pools", "/requests", "/queues", "/config/versions", "/nodes", "/pool-trees"
            } <= set(lists)


def test_not_ready_when_the_database_no_longer_holds_this_servers_schema(
    server: ApiServer,
) -> None:
    """/readyz ran ``SELECT 1``: it said ready while every request failed, after a newer
    fairpool upgraded the schema or the database was dropped and made again."""
    option, where = server.store
    db = Database.open(f"sqlite:///{Path(where) / 'fairpool.db'}" if option == "--home" else where)
    try:
        with db.write() as conn:
            conn.execute(text("UPDATE alembic_version SET version_num = '9999'"))
        moved = (f"the database's schema is at revision 9999, and this process works with "
                 f"revision {SCHEMA_HEAD}: run the fairpool that migrated it")
        try:
            refused = httpx.get(server.url + "/readyz")
            assert refused.status_code == 503
            assert refused.json()["detail"] == moved
            # Nor does it write any more (it wrote on: rows the newer code reads otherwise;
            # helper-80), its tick included.
            with db.read() as conn:
                before = conn.execute(text("SELECT value FROM store_generation")).scalar()
            write = httpx.post(server.url + API + "/pools", json={"name": "after-the-move",
                                                                  "capacity": {"gpu": 1}})
            assert (write.status_code, write.json()["detail"]) == (503, moved)
            time.sleep(1.5)  # a tick or more
            with db.read() as conn:
                assert conn.execute(text("SELECT value FROM store_generation")).scalar() == before
        finally:
            with db.migrating() as conn:  # a write would be refused: the schema moved
                conn.execute(text("UPDATE alembic_version SET version_num = :head"),
                             {"head": SCHEMA_HEAD})
        assert ok(httpx.get(server.url + "/readyz")) == {"status": "ready"}
        ok(httpx.post(server.url + API + "/pools", json={"name": "after-the-move",
                                                        "capacity": {"gpu": 1}}), 201)
    finally:
        db.close()


def test_a_long_poll_reads_its_request_once_and_not_when_its_pass_wakes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given the id, it watches from before its first read, so a change committed after
    that read wakes it: no second read to close that gap. Woken by this process's pass, the
    view that pass hands it is the answer, unread. Given a prefix, it watches the id once
    known, and reads again. Still queued at the deadline, it reads the whole view (queue
    positions) last."""
    from fairpool.api.app import create_app
    from tests.test_service import team_service

    with team_service(f"sqlite:///{tmp_path / 'fairpool.db'}", gpus=1) as service:
        holder = service.create_request("team", demand={"gpu": 1})
        waiting = [service.create_request("team", demand={"gpu": 1}) for _ in range(3)]
        calls: list[str] = []
        for name in ("decided_request", "get_request"):
            method = getattr(service, name)
            monkeypatch.setattr(service, name, lambda ref, name=name, method=method, **how: (
                calls.append(name), method(ref, **how))[1])
        with (serving(create_app(service, tick=3600.0)) as url,
              httpx.Client(base_url=url + API, timeout=30.0) as client,
              ThreadPoolExecutor(1) as pool):
            for ref, reads_before_the_release, release in (
                (waiting[0].id, 1, holder.id),
                (waiting[1].id[:8], 2, waiting[0].id),
            ):
                calls.clear()
                polling = pool.submit(client.get, f"/requests/{ref}/wait", params={"timeout": 20})
                while len(calls) < reads_before_the_release:
                    time.sleep(0.01)
                assert ok(client.post(f"/requests/{release}/release"))["status"] == "released"
                answer = ok(polling.result(10))
                assert answer["status"] == "allocated"
                # Woken by the pass that allocated it, with its view: no read.
                assert calls == ["decided_request"] * reads_before_the_release
                assert answer == ok(client.get(f"/requests/{answer['id']}"))
            calls.clear()
            timed_out = ok(client.get(f"/requests/{waiting[2].id}/wait", params={"timeout": 0.1}))
            assert timed_out["status"] == "queued" and timed_out["queue"][0]["position"] == 1
            assert calls == ["decided_request", "decided_request", "get_request"]


def test_the_server_keeps_what_lives_from_its_start_out_of_full_collections(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``serve`` freezes what is alive once it is set up (``gc.freeze``), just before it runs
    uvicorn's server: the collector's full passes then skip those objects."""
    import gc

    from fairpool.api import server as server_module

    frozen: list[int] = []
    monkeypatch.setattr(
        server_module._Server, "run", lambda self, sockets: frozen.append(gc.get_freeze_count())
    )
    try:
        server_module.serve(port=free_port(), home=str(tmp_path / "home"), log_level="warning")
    finally:
        gc.unfreeze()
    # The modules and the app alone are tens of thousands of objects.
    assert frozen and frozen[0] > 50_000, frozen


def test_leases_expire_through_the_reconciler_tick(client: httpx.Client) -> None:
    setup_pool(client, "lease-gpus", "lease-orch", {"gpu": 1})
    body = {"component": "lease-orch", "resources": {"gpu": 1}, "lease_ttl": 1}
    holder = ok(client.post("/requests", json=body), 201)
    assert holder["status"] == "allocated" and holder["lease_expires_at"] is not None
    waiter = submit(client, "lease-orch", gpu=1)
    assert waiter["status"] == "queued"

    # Nobody heartbeats the holder: the tick expires its lease and the waiter gets the GPU.
    started = time.monotonic()
    woken = ok(client.get(f"/requests/{waiter['id']}/wait", params={"timeout": 10}))
    assert woken["status"] == "allocated"
    assert time.monotonic() - started < 3.0
    expired = ok(client.get(f"/requests/{holder['id']}"))
    assert expired["status"] == "released" and "lease expired" in expired["status_reason"]
    ok(client.post(f"/requests/{waiter['id']}/release"))

    # Heartbeats every 0.3 s keep a 1 s lease alive.
    kept = ok(client.post("/requests", json=body), 201)
    until = time.monotonic() + 2.5
    while time.monotonic() < until:
        assert ok(client.post(f"/requests/{kept['id']}/heartbeat"))["status"] == "allocated"
        time.sleep(0.3)
    assert ok(client.get(f"/requests/{kept['id']}"))["status"] == "allocated"
    ok(client.post(f"/requests/{kept['id']}/release"))
    assert ok(client.get("/pools/lease-gpus"))["occupied"] == {"gpu": 0}


@pytest.mark.parametrize("backend", BACKENDS)
def test_sigterm_finishes_in_flight_requests_and_loses_nothing(
    tmp_path: Path, backend: Backend, new_database: Callable[..., str]
) -> None:
    """SIGTERM while a long-poll waits and clients submit and release: the long-poll is
    answered, the process exits 0, and whatever any client was told stays true after a
    restart."""
    url = new_database(backend, migrated=True)
    # Logging uvicorn's shutdown steps: once, under load, it exited only after 15 s.
    first = ApiServer(tmp_path / "server.log", database_url=url, extra=("--log-level", "info"))
    first.start()
    told: dict[str, str] = {}  # request id -> the last status a client was told
    try:
        with httpx.Client(base_url=first.url + API, timeout=30.0) as c:
            setup_pool(c, "gpus", "orch", {"gpu": 2}, priority=5, reserved={"gpu": 1})
            held = submit(c, "orch", gpu=2)
            queued = submit(c, "orch", gpu=1)
            setup_pool(c, "storm", "storm-orch", {"gpu": 4})
            before = state(c)

        #: Set by each storm once it was told twice (a submit and its release).
        going = [threading.Event() for _ in range(4)]

        def storm(index: int) -> int:
            """Submit and release until the server stops answering; how many were told."""
            answers = 0
            with httpx.Client(base_url=first.url + API, timeout=30.0) as c:
                while True:
                    try:
                        created = c.post("/requests", json={"component": "storm-orch",
                                                            "resources": {"gpu": 1}})
                        if created.status_code != 201:
                            return answers
                        request = created.json()
                        told[request["id"]] = request["status"]
                        released = c.post(f"/requests/{request['id']}/release")
                        if released.status_code != 200:
                            return answers
                        told[request["id"]] = released.json()["status"]
                        answers += 2
                        going[index].set()
                    except httpx.TransportError:
                        return answers

        with ThreadPoolExecutor(5) as pool, httpx.Client(base_url=first.url + API,
                                                        timeout=30.0) as waiter:
            # A long-poll in flight when SIGTERM arrives is answered, then the process exits 0.
            # Its connection is made first: made in its thread, on a loaded machine it could
            # come after the SIGTERM below and be refused (seen once, 2026-11-27).
            ok(waiter.get(f"/requests/{queued['id']}"))
            sent = threading.Event()  # the long-poll is going out on its connection
            waiter.event_hooks["request"] = [lambda request: sent.set()]
            future = pool.submit(
                waiter.get, f"/requests/{queued['id']}/wait", params={"timeout": 30}
            )
            storms = [pool.submit(storm, index) for index in range(4)]
            # Every storm under way (each makes its connection in its thread: on a loaded
            # machine one made after the SIGTERM is refused, and a fixed 0.5 s left one with
            # nothing told), and the long-poll sent before them.
            assert sent.wait(30)
            assert all(event.wait(30) for event in going), [f.result() for f in storms if f.done()]
            started = time.monotonic()
            assert first.terminate() == 0
            assert time.monotonic() - started < 5.0
            answer = future.result(timeout=5)
            assert all(f.result(timeout=30) > 0 for f in storms)
        assert answer.status_code == 200 and answer.json()["status"] == "queued"
    finally:
        first.stop()

    second = ApiServer(tmp_path / "server.log", database_url=url)
    second.start()
    try:
        with httpx.Client(base_url=second.url + API, timeout=30.0) as c:
            pools, policies, requests = state(c)
            # The storm's pool holds what its requests hold (checked below).
            assert [p[:4] for p in pools] == [p[:4] for p in before[0]]
            assert [p for p in pools if p[1] != "storm"] == [p for p in before[0] if p[1] != "storm"]
            assert policies == before[1]
            assert [r for r in requests if r[0] not in told] == before[2]
            stored = {r[0]: r[1] for r in requests if r[0] in told}
            assert stored == told  # every answer a client got is what was committed
            assert ok(c.get(f"/requests/{held['id']}"))["status"] == "allocated"
            assert ok(c.get(f"/requests/{queued['id']}"))["queue"][0]["position"] == 1
            assert ok(c.get("/policies"))["items"][0]["priority"] == 5
            occupied = ok(c.get("/pools/storm"))["occupied"]["gpu"]
            assert occupied == sum(status == "allocated" for status in told.values())
    finally:
        second.stop()
    assert "Traceback" not in (tmp_path / "server.log").read_text()


def test_a_sighup_shuts_the_server_down_as_sigterm_does(tmp_path: Path) -> None:
    """A server in a terminal that closes got SIGHUP, which ended it at once: long-polls
    unanswered, the database not closed."""
    server = ApiServer(tmp_path / "server.log", home=tmp_path / "home",
                       extra=("--log-level", "info"))
    server.start()
    try:
        with httpx.Client(base_url=server.url + API, timeout=30.0) as c:
            setup_pool(c, "hup-gpus", "hup-orch", {"gpu": 1})
            submit(c, "hup-orch", gpu=1)
            queued = submit(c, "hup-orch", gpu=1)
            with ThreadPoolExecutor(1) as pool:
                # Set as the pool's thread sends the long-poll: a fixed sleep from the submit
                # assumed that thread had run, and one sent after the signal is refused.
                sent = threading.Event()
                c.event_hooks["request"] = [lambda request: sent.set()]
                waiting = pool.submit(c.get, f"/requests/{queued['id']}/wait",
                                      params={"timeout": 30})
                assert sent.wait(10)
                time.sleep(0.3)  # from its sending on, not from the submit: the server has it
                assert server.process is not None
                server.process.send_signal(signal.SIGHUP)
                assert server.process.wait(timeout=10) == 0
                answer = waiting.result(timeout=5)
        assert answer.status_code == 200 and answer.json()["status"] == "queued"
        assert "Application shutdown complete" in server.log()
    finally:
        server.stop()


def test_localhost_is_served_on_127_0_0_1_where_it_resolves_to_ipv6_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With `::1 localhost` first in /etc/hosts (Debian's), `--host localhost` listened on
    ::1 alone, and the clients' default, 127.0.0.1, was refused. uvicorn binds IPv4 for a
    host without a colon."""
    real = socket.getaddrinfo

    def ipv6_first(host: str, port: int, family: int = 0, *args: Any, **kwargs: Any) -> Any:
        found = real(host, port, family, *args, **kwargs)
        if host == "localhost" and family == 0:
            return [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::1", port, 0, 0)), *found]
        return found

    monkeypatch.setattr(socket, "getaddrinfo", ipv6_first)
    with _listen("localhost", 0) as listening:
        assert listening.family == socket.AF_INET
        assert listening.getsockname()[0] == "127.0.0.1"


def test_a_port_in_use_or_a_bad_host_is_one_line_and_creates_no_store(tmp_path: Path) -> None:
    """uvicorn's own error among its INFO lines (exit 3), after the store was created and
    written; `python -m fairpool.api --port -1`: two tracebacks."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        home = tmp_path / "home"
        env = {k: v for k, v in os.environ.items() if not k.startswith("FAIRPOOL_")}
        env["FAIRPOOL_HOME"] = str(home)
        for args, code, line in [
            (("-m", "fairpool.cli.main", "server", "--port", str(port)), 1,
             f"Error: cannot listen on '127.0.0.1' port {port}: Address already in use"),
            (("-m", "fairpool.api", "--port", str(port)), 1,
             f"Error: cannot listen on '127.0.0.1' port {port}: Address already in use"),
            (("-m", "fairpool.cli.main", "server", "--host", "999.1.1.1"), 1,
             "Error: cannot listen on '999.1.1.1' port 8600: "),
            (("-m", "fairpool.api", "--port", "-1"), 2,
             "python -m fairpool.api: error: --port must be from 1 to 65535 (got -1)"),
        ]:
            run = subprocess.run([sys.executable, *args], env=env,
                                 capture_output=True, text=True, timeout=60)
            assert run.returncode == code, (args, run.stderr)
            assert run.stderr.strip().splitlines()[-1].startswith(line), (args, run.stderr)
            assert "Traceback" not in run.stderr and not home.exists(), args


def test_a_bracketed_ipv6_host_is_served(tmp_path: Path) -> None:
    """`--host [::1]`, as a URL writes it (and the server's own "Serving on" line), was
    refused: "cannot listen on '[::1]' ...: Name or service not known" (helper-87)."""
    with socket.socket(socket.AF_INET6) as probe:
        probe.bind(("::1", 0))
        port = probe.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAIRPOOL_")}
    env["FAIRPOOL_HOME"] = str(tmp_path / "home")
    server = subprocess.Popen(
        [sys.executable, "-m", "fairpool.cli.main", "server", "--host", "[::1]", "--port",
         str(port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        poll_until(lambda: _ready(f"http://[::1]:{port}/readyz"), 30)
    finally:
        server.terminate()
        _, err = server.communicate(timeout=30)
    assert f"Serving on http://[::1]:{port}" in err, err


def _ready(url: str) -> bool:
    try:
        return httpx.get(url, timeout=5).status_code == 200
    except httpx.TransportError:
        return False


# -- concurrency -------------------------------------------------------------------------


def test_concurrent_clients_never_overcommit(client: httpx.Client, server: ApiServer) -> None:
    setup_pool(client, "conc-gpus", "conc-orch", {"gpu": 4})
    threads, per_thread = 16, 10
    stop = threading.Event()
    samples: list[int] = []

    def monitor() -> None:
        with httpx.Client(base_url=client.base_url, timeout=30.0) as c:
            while not stop.is_set():
                pool = ok(c.get("/pools/conc-gpus"))
                occupied = pool["occupied"]["gpu"]
                assert occupied <= 4, pool
                assert sum(r["resources"]["gpu"] for r in pool["active_requests"]) == occupied
                samples.append(occupied)
                time.sleep(0.01)

    def worker(seed: int) -> list[str]:
        rng = random.Random(seed)
        ids = []
        with httpx.Client(base_url=client.base_url, timeout=30.0) as c:
            for _ in range(per_thread):
                request = submit(c, "conc-orch", gpu=rng.choice((1, 1, 2)))
                ids.append(request["id"])
                while request["status"] == "queued":
                    request = ok(c.get(f"/requests/{request['id']}/wait", params={"timeout": 10}))
                assert request["status"] == "allocated", request
                time.sleep(rng.uniform(0, 0.01))
                assert ok(c.post(f"/requests/{request['id']}/release"))["status"] == "released"
        return ids

    with ThreadPoolExecutor(threads + 1) as pool:
        watching = pool.submit(monitor)
        try:
            ids = [i for f in [pool.submit(worker, n) for n in range(threads)] for i in f.result()]
        finally:
            stop.set()
        watching.result()

    assert len(ids) == len(set(ids)) == threads * per_thread
    assert samples and max(samples) <= 4
    final = ok(client.get("/requests", params={"component": "conc-orch", "limit": 10000}))
    assert final["pagination"]["total"] == threads * per_thread
    assert {r["id"] for r in final["items"]} == set(ids)
    assert all(r["status"] == "released" and r["released_at"] for r in final["items"])
    pool_after = ok(client.get("/pools/conc-gpus"))
    assert pool_after["occupied"] == {"gpu": 0} and pool_after["queue_length"] == 0
    assert "Traceback" not in server.log_path.read_text()


# -- the scheduler config over HTTP (seed 004) ---------------------------------------------------

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "scheduler"


def test_a_server_without_tokens_answers_no_other_sites_page(
    client: httpx.Client, server: ApiServer
) -> None:
    """Without tokens, a page on any site could have the user's browser release or cancel a
    request, or roll the config back (a body-less POST needs no CORS preflight), and after
    DNS rebinding read and write everything (fairpool.api.browsers)."""
    setup_pool(client, "site-gpus", "site-orch", {"gpu": 1})
    held = submit(client, "site-orch", gpu=1)
    port = server.port
    release = f"/requests/{held['id']}/release"
    for headers, field in [
        ({"Origin": "http://evil.example"}, "Origin"),
        ({"Origin": "null"}, "Origin"),  # a sandboxed frame, a file:// page
        ({"Origin": f"http://127.0.0.1:{port + 1}"}, "Origin"),  # another port: another site
        ({"Host": f"attacker.example:{port}"}, "Host"),
        # Not a loopback name or address, however bracketed or dotted.
        *(({"Host": host}, "Host") for host in (
            f"[::1]evil:{port}", f"[localhost]:{port}", f"[[localhost]]:{port}", "[::1.]",
            f"localhost..:{port}", f".:{port}", f"localhost.evil:{port}", "")),
        # DNS rebinding: the page's own name now points at 127.0.0.1, so it is same-origin.
        ({"Host": f"attacker.example:{port}", "Origin": f"http://attacker.example:{port}"},
         "Host"),
    ]:
        for method, path in (("POST", release), ("GET", "/pools"), ("GET", "/healthz")):
            refused = client.request(method, path, headers=headers)
            assert refused.status_code == 403, (headers, path, refused.text)
            assert refused.json()["field"] == field
            assert refused.json()["detail"].startswith("refused: ")
    assert ok(client.get(f"/requests/{held['id']}"))["status"] == "allocated"
    for name in ("localhost", "127.0.0.1", "[::1]", "LOCALHOST", "localhost."):
        ok(client.get("/pools", headers={"Host": f"{name}:{port}"}))
    # The server's own page (/docs) calls it with its own origin.
    ok(client.post(release, headers={"Origin": f"http://127.0.0.1:{port}"}))


def test_scheduler_config_routes(client: httpx.Client) -> None:
    shape = client.post("/config/validate", json={"document": "resource_queues: [{nme: q}]\n"})
    assert shape.status_code == 422
    assert [(e["path"], e["message"]) for e in shape.json()["errors"]] == [
        ("resource_queues[0].nme", "unknown key 'nme'; did you mean 'name'?"),
        ("resource_queues[0].name", "is required"),
    ]
    reference = client.post(
        "/config/validate", json={"document": "scheduling_rules: [{resource_queue: nowhere}]\n"}
    )
    assert reference.status_code == 400
    assert reference.json()["errors"][0]["path"] == "scheduling_rules[0].resource_queue"
    assert client.post("/config", json={"document": "x: 1\n"}).status_code == 422
    assert client.post("/config", json={"document": 5}).status_code == 422  # not a string
    document = (EXAMPLES / "m5-cap.yaml").read_text()
    valid = ok(client.post("/config/validate", json={"document": document}))
    assert valid["valid"] is True
    applied = ok(client.post("/config", json={"document": document}), 201)
    version = applied["version"]["version"]
    assert ok(client.get("/config"))["version"] == version
    m5 = {"instance_type": "m5.2xlarge", "demand": {"cpu": 8, "memory_gb": 32}}
    statuses = [ok(client.post("/workloads", json=m5), 201)["status"] for _ in range(4)]
    assert statuses == ["admitted"] * 3 + ["queued"]
    queue = ok(client.get("/queues/q-m5-2xlarge-cap3"))
    assert (queue["admitted"], queue["queued"]) == (3, 1)
    gauges = scrape(client)
    cap3 = {"queue": "q-m5-2xlarge-cap3"}
    cpu = {**cap3, "flavor": "m5-2xlarge", "resource": "cpu"}
    assert (gauges["fairpool_queue_waiting_workloads", frozenset(cap3.items())],
            gauges["fairpool_queue_admitted_workloads", frozenset(cap3.items())],
            gauges["fairpool_queue_used_units", frozenset(cpu.items())],
            gauges["fairpool_queue_nominal_quota_units", frozenset(cpu.items())]) == (1, 3, 24, 24)
    assert client.post("/workloads", json={**m5, "colour": "red"}).status_code == 422
    bad = client.post("/workloads", json={"labels": {"instance-type": "x"}})
    assert bad.status_code == 422 and bad.json()["field"] == "labels.instance-type"
    assert client.get("/workloads/ffffffff").status_code == 404
    assert client.get("/config", params={"version": 999}).status_code == 404
    changed = document.replace("nominal_quota: 24", "nominal_quota: 32")
    immutable = client.post("/config", json={"document": changed})
    assert immutable.status_code == 400 and "new name" in immutable.text
    assert ok(client.get("/config"))["version"] == version  # nothing applied


def scrape(client: httpx.Client) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """The server's /metrics: each sample's value by its name and labels."""
    response = httpx.get(client.base_url.copy_with(path="/metrics"))
    assert response.status_code == 200
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(response.text)
            for sample in family.samples}


def test_a_long_poll_whose_client_has_gone_stops(client: httpx.Client, server: ApiServer) -> None:
    """Served by ``BusyRoutes``; through FastAPI's routes (with tokens) in test_auth."""
    setup_pool(client, "gone-gpus", "gone-orch", {"gpu": 1})
    held, waiter = submit(client, "gone-orch", gpu=1), submit(client, "gone-orch", gpu=1)
    long_poll_stops_when_its_client_goes(client, server, held["id"], waiter["id"])


def long_poll_stops_when_its_client_goes(
    client: httpx.Client, server: ApiServer, held: str, waiter: str
) -> None:
    """A client that closed its connection (killed, or its own timeout shorter than the
    poll's): the poll read on for nobody, once a second, until its timeout, up to 60 s
    (helper-96). ``fairpool_long_polls`` counts the polls waiting. ``client`` holds ``held``,
    for which ``waiter`` waits."""
    assert ok(client.get(f"/requests/{waiter}"))["status"] == "queued"

    def polls() -> float:
        return scrape(client)[("fairpool_long_polls", frozenset())]

    before = polls()
    address = httpx.URL(server.url)
    with socket.create_connection((address.host, address.port)) as asking:
        headers = "".join(f"{name}: {value}\r\n" for name, value in client.headers.items()
                          if name.lower() == "authorization")
        asking.sendall(f"GET {API}/requests/{waiter}/wait?timeout=30 HTTP/1.1\r\n"
                       f"Host: {address.host}\r\n{headers}\r\n".encode())
        poll_until(lambda: polls() == before + 1, 10)
    assert poll_until(lambda: polls() == before, 10) < 3  # within RECHECK_SECONDS, not 30 s
    # Still served: a poll that stays answers when its request is decided.
    ok(client.post(f"/requests/{held}/release"))
    assert ok(client.get(f"/requests/{waiter}/wait", params={"timeout": 10}))[
        "status"] == "allocated"
    ok(client.post(f"/requests/{waiter}/release"))


def test_the_widest_body_any_client_writes_is_read(client: httpx.Client) -> None:
    """64 labels and 64 resource keys, each as long as may be, in characters JSON escapes in
    12 bytes: 587 kB, past the 64 KiB that bodies were held to (the widest labels the SDK
    sent were refused with 413, where the embedded store took them; found by helper-65).
    Read and answered in the service's words, whatever is wrong in it."""
    wide = "\U0001F600" * 253
    body = json.dumps({  # ASCII escapes, as json.dumps writes by default
        "component": wide + "ab", "resources": {f"{i:02d}{wide}": 1 for i in range(64)},
        "labels": {f"{i:02d}{wide}": wide + "ab" for i in range(64)},
    })
    assert len(body) > 500_000
    answer = client.post("/requests", content=body, headers={"content-type": "application/json"})
    assert answer.status_code == 404, answer.text  # no such component; read, not refused
    assert answer.json()["detail"].startswith("no orchestrator")


def test_every_route_taking_a_config_document_takes_one_at_its_limit(client: httpx.Client) -> None:
    """A document of nearly 60,000 characters, half of them "é", is 100 KB as the SDK sends
    it (ASCII escapes): each route that takes a document takes it. ``/config/preview`` kept
    the 64 KiB limit of other bodies, so the confirmed ``config apply`` of such a document
    answered 413 where ``--yes`` applied it."""
    from fairpool.frontends.config import MAX_DOCUMENT

    head = "resource_flavors: [{name: f}]\n"
    document = head + ("#" + "é" * 98 + "\n") * ((MAX_DOCUMENT - len(head)) // 100)
    body = json.dumps({"document": document})  # ASCII escapes, as the SDK writes it
    assert len(body) > 64 * 1024 and len(document) <= MAX_DOCUMENT
    headers = {"content-type": "application/json"}
    for path, status in (("/config/validate", 200), ("/config/preview", 200), ("/config", 201)):
        assert client.post(path, content=body, headers=headers).status_code == status, path


def test_a_sigterm_while_the_loop_holds_the_notifiers_lock_shuts_down(tmp_path: Path) -> None:
    """The signal handler woke the long-polls itself, taking the notifier's lock, which the
    loop's thread (where handlers run) takes for every long-poll: a SIGTERM landing while it
    held it deadlocked the server."""
    import asyncio
    import queue
    import signal

    import uvicorn

    from fairpool.api.app import create_app
    from fairpool.api.server import _Server
    from fairpool.service import open_service

    service = open_service(str(tmp_path))
    try:
        api = create_app(service).state.api
        server = _Server(uvicorn.Config(lambda: None), on_exit=api.begin_shutdown)

        async def signalled() -> None:
            with api.notifier.watch("a-request"), api.notifier._lock:  # a long-poll begins
                server.handle_exit(signal.SIGTERM, None)
            await asyncio.sleep(0)
            assert api.stopping and api.notifier.closed and server.should_exit

        ended: queue.Queue[BaseException | None] = queue.Queue()

        def run() -> None:
            try:
                asyncio.run(signalled())
            except BaseException as error:
                ended.put(error)
            else:
                ended.put(None)

        threading.Thread(target=run, daemon=True).start()
        error = ended.get(timeout=10)  # queue.Empty: the thread deadlocked
        if error is not None:
            raise error
        server.handle_exit(signal.SIGTERM, None)  # no loop: at once
    finally:
        service.close()


@pytest.mark.parametrize("how", ["forced", "grace over", "graceful"])
def test_a_write_in_flight_when_the_server_stops_is_not_answered_500(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """Ctrl-C twice (uvicorn's force quit), or the shutdown's grace running out, cancels the
    requests in flight, whose writes commit all the same (here one waits for the write lock
    that another process holds): uvicorn answered 500, which no client retries. It is 503,
    and the retry with the same idempotency key answers what the write made. One Ctrl-C still
    lets the request finish."""
    import signal
    import sqlite3

    import uvicorn

    from fairpool.api.app import create_app
    from fairpool.api.server import _Server
    from tests.test_service import team_service

    database = tmp_path / "fairpool.db"
    with team_service(f"sqlite:///{database}", gpus=1) as service:
        app = create_app(service, tick=3600.0)
        api = app.state.api
        queued = threading.Event()
        write = api.write

        async def noted(*args: Any, **kwargs: Any) -> Any:
            queued.set()  # the write is queued before the loop turns again
            return await write(*args, **kwargs)

        monkeypatch.setattr(api, "write", noted)
        config = uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning",
                                timeout_graceful_shutdown=0.2 if how == "grace over" else 30)
        server = _Server(config, on_exit=api.begin_shutdown)
        running = threading.Thread(target=server.run, daemon=True)
        running.start()
        lock = sqlite3.connect(database, isolation_level=None)
        try:
            while not server.started:
                time.sleep(0.01)
            lock.execute("BEGIN IMMEDIATE")
            body = {"component": "team", "resources": {"gpu": 1}, "idempotency_key": how}
            with httpx.Client(base_url=f"http://127.0.0.1:{config.port}{API}",
                              timeout=30.0) as client, ThreadPoolExecutor(1) as pool:
                answer = pool.submit(client.post, "/requests", json=body)
                assert queued.wait(10)
                server.handle_exit(signal.SIGINT, None)
                if how == "forced":
                    server.handle_exit(signal.SIGINT, None)
                elif how == "graceful":
                    time.sleep(0.3)  # shutting down, waiting for the request
                    lock.execute("COMMIT")
                response = answer.result(10)
        finally:
            if lock.in_transaction:
                lock.execute("COMMIT")
            lock.close()
        running.join(10)  # once the write it waits for has ended
        assert not running.is_alive()
        if how == "graceful":
            assert response.status_code == 201, response.text
        else:
            assert response.status_code == 503, response.text
            assert response.json()["detail"].startswith("server shutting down; retry later")
            assert response.headers["Retry-After"] == "1"
            poll_until(lambda: len(service.list_requests(component="team")) == 1, 10)
        retried = service.create_request("team", demand={"gpu": 1}, idempotency_key=how)
        [made] = service.list_requests(component="team")
        assert (retried.id, retried.status) == (made.id, "allocated")


@pytest.mark.parametrize(
    "amount", [True, None, "abc", -1, "1.2345", [1], {"a": 1}, "1" * 41, 10**13, "1e400"],
    ids=repr,
)
def test_a_bad_demand_is_worded_as_embedded(client: httpx.Client, amount: Any) -> None:
    """The API's own check said "must be an integer (got True)" where the service says "must
    be a number (got True)": the service's check is the only one now."""
    from fairpool.errors import InvalidInput
    from fairpool.frontends.workloads import validate_workload

    with pytest.raises(InvalidInput) as embedded:
        validate_workload("w", demand={"gpu": amount}, submitted_at=0)
    for route in ("/workloads", "/config/explain"):
        answer = client.post(route, json={"demand": {"gpu": amount}})
        assert answer.status_code == 422, answer.text
        assert answer.json() == {"detail": str(embedded.value), "field": "demand.gpu"}


def test_a_server_behind_a_proxy_path_names_its_prefix(tmp_path: Path) -> None:
    """``--root-path /fp``: a proxy serves it under /fp and removes the prefix. The pages
    loaded their scripts, and "Try it out" posted, at the proxy's root (helper-96). A
    create's ``Location`` is under it too."""
    server = ApiServer(tmp_path / "server.log", home=tmp_path / "home", extra=("--root-path", "/fp/"))
    with running(server):
        assert ok(httpx.get(server.url + "/openapi.json"))["servers"] == [{"url": "/fp"}]
        page = httpx.get(server.url + "/docs").text
        assert 'src="/fp/docs/assets/swagger-ui-bundle.js"' in page and "'/fp/openapi.json'" in page
        with httpx.Client(base_url=server.url + API, timeout=10.0) as client:
            made = client.post("/pools", json={"name": "p", "capacity": {"gpu": 1}})
            assert (made.status_code, made.headers["location"], made.headers["cache-control"]
                    ) == (201, "/fp/api/v1/pools/p", "no-store")
            ok(client.post("/pools/p/policies", json={"component": "c"}), 201)
            made = client.post("/requests", json={"component": "c", "resources": {"gpu": 1}})
            held = ok(made, 201)
            assert held["status"] == "allocated"
            assert made.headers["location"] == f"/fp/api/v1/requests/{held['id']}"
            assert ok(client.post(f"/requests/{held['id']}/release"))["status"] == "released"
    refused = subprocess.run([sys.executable, "-m", "fairpool.api", "--home", str(tmp_path / "x"),
                              "--root-path", "fp", "--port", str(free_port())],
                             capture_output=True, text=True, timeout=60)
    assert (refused.returncode, refused.stderr) == (1, "Error: root-path: must be a path such as "
                                                    "/fairpool: the prefix a proxy serves the "
                                                    "server under (got 'fp')\n")

"""The API's documentation pages, rendered by a real headless Chromium against a real server,
with every host but the loopback address unresolvable: the pages must work on a network
without the internet, so their scripts and styles come from the server itself.

The pages read no database, so one backend (SQLite) is enough. Without Chromium the tests are
skipped, except under CI (``$CI`` set), where they fail: `.ci/run` installs it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.servers import ApiServer, running

BROWSERS = ("chromium", "chromium-browser", "google-chrome")


@pytest.fixture(scope="module")
def chromium() -> str:
    found = os.environ.get("FAIRPOOL_TEST_CHROMIUM") or next(
        (path for path in map(shutil.which, BROWSERS) if path), None
    )
    if found is None:
        reason = f"no browser found ({', '.join(BROWSERS)}, or $FAIRPOOL_TEST_CHROMIUM)"
        if os.environ.get("CI"):
            pytest.fail(f"{reason}; CI must run the browser tests", pytrace=False)
        pytest.skip(reason)
    return found


@pytest.fixture(scope="module", params=[False, True], ids=["no-auth", "auth"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[ApiServer]:
    root = tmp_path_factory.mktemp("docs")
    extra = ("--auth",) if request.param else ()
    with running(ApiServer(root / "server.log", home=root / "home", extra=extra)) as (api,):
        yield api


def rendered(browser: str, url: str, profile: Path) -> str:
    """The page's DOM once its scripts have run, every name but 127.0.0.1 unresolvable."""
    result = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", f"--user-data-dir={profile}",
         "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
         # Virtual time: runs ahead while the page is idle, so this is a bound, not a wait.
         "--virtual-time-budget=30000", "--dump-dom", url],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def openapi(server: ApiServer) -> dict[str, dict[str, dict[str, str]]]:
    paths: dict[str, dict[str, dict[str, str]]] = httpx.get(
        server.url + "/openapi.json", timeout=10.0
    ).json()["paths"]
    return paths


def test_swagger_ui_shows_every_path_and_asks_for_a_token_only_with_auth(
    chromium: str, server: ApiServer, tmp_path: Path
) -> None:
    dom = rendered(chromium, server.url + "/docs", tmp_path / "profile")
    shown = set(re.findall(r'class="opblock-summary-path" data-path="([^"]*)"', dom))
    assert shown == set(openapi(server))
    auth = "--auth" in server.extra
    assert ('class="btn authorize' in dom) is auth


def test_redoc_shows_every_operation(chromium: str, server: ApiServer, tmp_path: Path) -> None:
    dom = rendered(chromium, server.url + "/redoc", tmp_path / "profile")
    shown = set(re.findall(r'data-section-id="operation/([^"]*)"', dom))
    expected = {op["operationId"] for methods in openapi(server).values()
                for op in methods.values()}
    assert shown == expected

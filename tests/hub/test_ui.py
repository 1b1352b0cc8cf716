"""The web console (``hub.ui``) in real headless Chromium against a real LocalCluster (Selenium).

Debian's ``chromium`` and ``chromium-driver`` (``make system-deps``). With
``QUIRE_UI_SCREENSHOTS=DIR`` the tests save the pages they show as PNGs in
DIR (``QUIRE_UI_SCREENSHOTS=docs`` makes the README's pictures).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web

from hub.client import HedwigClient
from hub.ui.cluster import _alerts, topic_summary
from hub.ui.pages import _format
from tools.cluster import LocalCluster

from .conftest import hub_url
from .test_tls import make_ca, make_cert

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium missing: pip install -e '.[test]'")
from selenium.common.exceptions import (  # noqa: E402
    NoAlertPresentException,
    NoSuchElementException,
    StaleElementReferenceException,
)
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support import expected_conditions as ec  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

CHROMEDRIVER = "/usr/bin/chromedriver"
pytestmark = [pytest.mark.timeout(180),
              pytest.mark.skipif(not Path(CHROMEDRIVER).exists() or shutil.which("chromium") is None,
                                 reason="Debian chromium and chromium-driver missing: make system-deps")]
in_cluster = pytest.mark.asyncio(loop_scope="module")

TOKEN = "ui-admin-token"
CONF = {"bk_ensemble_size": "1", "bk_write_quorum_size": "1", "bk_ack_quorum_size": "1", "zk_timeout": "1000",
        "http_admin_token": TOKEN, "rebalance_interval_sec": "0"}
MANUAL = {"auto_send_consume_message_enabled": "false"}
PREFIX = "/quire"          # hub 1 sits behind a reverse proxy under this prefix
WAIT = 20.0
SHOTS = os.environ.get("QUIRE_UI_SCREENSHOTS", "")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalCluster]:
    root = tmp_path_factory.mktemp("webui")
    pem, _ = make_cert(root, ca=make_ca(root))
    c = LocalCluster(bookies=2, hubs=2, data_dir=root / "cluster", conf_overrides=CONF)
    # hub 1: behind a proxy under PREFIX, and serving its clients over TLS too (the console does not mind)
    c.set_hub_conf(1, http_ui_base_path=PREFIX, ssl_enabled="true", cert_path=str(pem), password="")
    async with c:
        yield c


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    profile = tempfile.mkdtemp(prefix="quire-chromium-")
    options = webdriver.ChromeOptions()
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", "--window-size=1280,900", f"--user-data-dir={profile}"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """The browser with a fresh tab state: no admin token kept, no dialog open."""
    yield browser
    with contextlib.suppress(NoAlertPresentException):
        browser.switch_to.alert.dismiss()
    with contextlib.suppress(Exception):
        browser.execute_script("sessionStorage.clear()")


@pytest_asyncio.fixture(loop_scope="module")
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as session:
        yield session


def ui(cluster: LocalCluster, path: str = "/ui/") -> str:
    return hub_url(cluster, 0) + path


def shot(driver: Any, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(SHOTS) / f"console-{name}.png"))


def wait_for(driver: Any, check: Callable[[Any], Any], timeout: float = WAIT) -> Any:
    return WebDriverWait(driver, timeout, poll_frequency=0.1,
                         ignored_exceptions=(StaleElementReferenceException, NoSuchElementException)).until(check)


def text_of(driver: Any, css: str) -> str:
    return str(driver.find_element(By.CSS_SELECTOR, css).text)


def no_alert(driver: Any) -> bool:
    try:
        _ = driver.switch_to.alert
    except NoAlertPresentException:
        return True
    return False


def row(driver: Any, table: str, key: str) -> Any:
    """The row of ``table`` whose key is ``key``, or ``None`` (looked up in one script call: no stale rows)."""
    return driver.execute_script(
        "return Array.from(document.querySelectorAll('table#' + arguments[0] + ' tbody tr'))"
        ".find((tr) => tr.dataset.key === arguments[1]) || null", table, key)


def link_text(driver: Any, table: str, key: str) -> str | None:
    """The text of the link in the row of ``table`` keyed ``key`` (one script call: no stale element)."""
    return driver.execute_script(
        "const tr = Array.from(document.querySelectorAll('table#' + arguments[0] + ' tbody tr'))"
        ".find((r) => r.dataset.key === arguments[1]); const a = tr && tr.querySelector('a');"
        "return a ? a.textContent : null", table, key)


def state_of(driver: Any, bookie: str) -> str:
    """The State cell of a bookie on the bookies page (the switch's label says "writable" too)."""
    return str(row(driver, "bookies", bookie).find_elements(By.TAG_NAME, "td")[1].text)


def polled(driver: Any) -> bool:
    """True once the page's script has polled the admin API at least once."""
    return text_of(driver, "#updated").startswith("updated")


async def stats(http: aiohttp.ClientSession, cluster: LocalCluster, topic: str) -> tuple[int, Any]:
    async with http.get(hub_url(cluster, 0) + f"/admin/v1/topics/{quote(topic, safe='')}/stats") as resp:
        return resp.status, await resp.json(content_type=None)


async def make_topic(cluster: LocalCluster, topic: str, messages: int, subs: tuple[str, ...] = ()) -> None:
    """Publish ``messages`` to ``topic`` and leave ``subs`` subscribed but detached."""
    async with await HedwigClient.connect(cluster.hub_addresses[0], MANUAL) as c:
        for sub in subs:
            await c.subscribe(topic.encode(), sub.encode())
        for i in range(messages):
            await c.publish(topic.encode(), b"m%d" % i)
        for sub in subs:
            await c.close_subscription(topic.encode(), sub.encode())


def test_topic_summary_and_the_banner_sentences() -> None:
    stats = {"topic": "t", "owner": "h:1", "publish_rate": 2.5, "last_seq_id": 9,
             "ledgers": [{"ledger_id": 3, "start_seq_id": 4, "end_seq_id": 9}],
             "subscriptions": {"a": {"backlog": 2, "msg_rate_out": 1.0}, "b": {"backlog": 5}}}
    assert topic_summary(stats) == {"topic": "t", "owner": "h:1", "publish_rate": 2.5, "msg_rate_out": 1.0,
                                    "last_seq_id": 9, "backlog": 7, "backlog_bytes": None, "storage_bytes": None,
                                    "subscriptions": 2, "ledgers": 1, "messages": 6}
    bookies = [{"address": "b1", "state": "read_only", "used_fraction": 0.2, "disk_usage_threshold": 0.95},
               {"address": "b2", "state": "writable", "used_fraction": 0.97, "disk_usage_threshold": 0.95},
               {"address": "b3", "state": "writable", "used_fraction": None, "disk_usage_threshold": None}]
    recovery = {"enabled": False, "under_replicated": [{"ledger_id": i} for i in range(12)]}
    assert _alerts([{"address": "h2", "error": "cannot ask it: timed out"}, {"address": "h1"}], bookies,
                   recovery) == [
        "12 ledger(s) under-replicated: 0, 1, 2, 3, 4, 5, 6, 7, 8, 9 ...", "AutoRecovery is disabled cluster-wide",
        "bookie b1 is read-only", "bookie b2 disk is over its threshold", "hub h2: cannot ask it: timed out"]
    assert _alerts([], bookies[2:], {"enabled": True, "under_replicated": []}) == []


@in_cluster
async def test_the_console_admin_resources_answer_and_refuse_bad_input(cluster: LocalCluster,
                                                                       http: aiohttp.ClientSession) -> None:
    base = hub_url(cluster, 1)                  # any hub answers for the whole cluster
    async with http.get(base + "/admin/v1/cluster") as resp:
        doc = await resp.json()
    assert resp.status == 200
    assert sorted(h["address"] for h in doc["hubs"]) == sorted(cluster.hub_addresses)
    assert all("error" not in h for h in doc["hubs"])
    assert sorted(b["address"] for b in doc["bookies"]) == sorted(cluster.bookie_addresses)
    assert all(b["info_error"] is None and b["disk_usage_threshold"] == 0.95 and b["http_url"].startswith("http://")
               for b in doc["bookies"])
    assert doc["autorecovery"]["under_replicated"] == [] and doc["alerts"] == []
    assert doc["topics_total"] == len(doc["topics"]) and doc["topics_note"] == ""
    bookie = cluster.bookie_addresses[0]
    url = f"{base}/admin/v1/bookies/{bookie}/readonly"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    cases = [("PUT", url, {"readOnly": True}, {}, 401, "missing or wrong Authorization"),
             ("PUT", url, {"readOnly": "yes"}, auth, 400, 'expected {"readOnly": true|false}'),
             ("PUT", f"{base}/admin/v1/bookies/127.0.0.1:1/readonly", {"readOnly": True}, auth, 404,
              "no registered bookie '127.0.0.1:1'"),
             ("POST", f"{base}/admin/v1/autorecovery/audit", None, {}, 401, "missing or wrong Authorization")]
    for method, where, body, headers, status, error in cases:
        async with http.request(method, where, json=body, headers=headers) as resp:
            assert (resp.status, error in (await resp.json())["error"]) == (status, True), (where, body)
    async with http.get(base + "/admin/v1/bookies") as resp:     # nothing changed, and it goes on serving
        assert resp.status == 200 and all(b["state"] == "writable" for b in await resp.json())


# --- pages ------------------------------------------------------------------------------------------
@in_cluster
async def test_overview_bookies_autorecovery_and_policies_pages(cluster: LocalCluster, page: Any,
                                                                http: aiohttp.ClientSession) -> None:
    topic = f"ui-overview-{uuid.uuid4().hex[:6]}"
    await make_topic(cluster, topic, 3, ("audit-sub",))
    page.get(ui(cluster))
    assert page.title.startswith("Overview")
    for address in cluster.hub_addresses:
        assert row(page, "hubs", address) is not None
    for address in cluster.bookie_addresses:
        tr = row(page, "bookies", address)
        assert tr is not None and "writable" in tr.text and "%" in tr.text
    topic_row = row(page, "topics", topic)
    assert topic_row is not None and cluster.hub_addresses[0] in topic_row.text
    wait_for(page, polled)
    link = topic_row.find_element(By.TAG_NAME, "a")
    assert link.get_attribute("href") == ui(cluster, f"/ui/topics/{topic}")
    shot(page, "overview")

    page.get(ui(cluster, "/ui/bookies"))
    wait_for(page, polled)
    for address in cluster.bookie_addresses:
        assert row(page, "bookies", address).find_element(By.CSS_SELECTOR, "button[data-action=readonly]")
    shot(page, "bookies")

    page.get(ui(cluster, "/ui/autorecovery"))
    assert "none: every ledger has its replicas" in text_of(page, "table#under-replicated")
    before = text_of(page, "[data-field=audit_requested_ms]")
    page.find_element(By.CSS_SELECTOR, "button[data-action=audit]").click()
    wait_for(page, ec.alert_is_present()).send_keys(TOKEN)
    page.switch_to.alert.accept()
    wait_for(page, lambda d: text_of(d, "#message") == "audit requested")
    wait_for(page, lambda d: text_of(d, "[data-field=audit_requested_ms]").endswith(" UTC")
             and text_of(d, "[data-field=audit_requested_ms]") != before)
    assert text_of(page, "#token-state") == "admin token kept for this tab"
    shot(page, "autorecovery")

    page.get(ui(cluster, "/ui/policies"))
    form = page.find_element(By.ID, "grant-form")
    form.find_element(By.NAME, "role").send_keys("ui-role")
    form.find_element(By.NAME, "prefix").send_keys("ui/")
    form.find_element(By.NAME, "consume").click()       # produce only
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()   # the token is kept from the last page
    wait_for(page, lambda d: row(d, "grants", "ui-role|ui/") is not None)
    assert "produce" in row(page, "grants", "ui-role|ui/").text
    assert "consume" not in row(page, "grants", "ui-role|ui/").text
    shot(page, "policies")
    row(page, "grants", "ui-role|ui/").find_element(By.CSS_SELECTOR, "button[data-action=revoke]").click()
    wait_for(page, ec.alert_is_present()).accept()          # the confirmation
    wait_for(page, lambda d: row(d, "grants", "ui-role|ui/") is None)


@in_cluster
async def test_read_only_switch_shows_on_the_overview_banner(cluster: LocalCluster, page: Any,
                                                             http: aiohttp.ClientSession) -> None:
    bookie = cluster.bookie_addresses[1]
    page.get(ui(cluster, "/ui/bookies"))
    page.execute_script(f"sessionStorage.setItem('quire-admin-token', '{TOKEN}')")
    row(page, "bookies", bookie).find_element(By.CSS_SELECTOR, "button[data-action=readonly]").click()
    wait_for(page, lambda d: state_of(d, bookie) == "read_only")
    try:
        page.get(ui(cluster))
        assert f"bookie {bookie} is read-only" in text_of(page, "#alerts")
    finally:
        page.get(ui(cluster, "/ui/bookies"))
        row(page, "bookies", bookie).find_element(By.CSS_SELECTOR, "button[data-action=readonly]").click()
        wait_for(page, lambda d: state_of(d, bookie) == "writable")
    page.get(ui(cluster))
    assert page.find_element(By.ID, "alerts").is_displayed() is False, text_of(page, "#alerts")


@in_cluster
async def test_topic_page_shows_a_live_publish_rate_while_a_producer_runs(cluster: LocalCluster, page: Any) -> None:
    topic = f"ui-live-{uuid.uuid4().hex[:6]}"
    await make_topic(cluster, topic, 1, ("live-sub",))
    page.get(ui(cluster, f"/ui/topics/{topic}"))
    assert text_of(page, "#topic-name") == topic
    assert row(page, "subscriptions", "live-sub") is not None
    stop = asyncio.Event()

    async def produce() -> int:
        n = 0
        async with await HedwigClient.connect(cluster.hub_addresses[0]) as c:
            while not stop.is_set():
                await c.publish(topic.encode(), b"tick")
                n += 1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.02)
        return n

    producer = asyncio.create_task(produce())
    try:
        def rising(d: Any) -> bool:
            rate = float(text_of(d, "#rate").removesuffix("/s") or 0)
            samples = d.find_element(By.CSS_SELECTOR, "svg#rate-chart polyline").get_attribute("data-samples")
            return rate > 0 and int(samples) >= 3

        await asyncio.to_thread(wait_for, page, rising, 40.0)
        if SHOTS:        # a picture with a curve in it
            await asyncio.to_thread(wait_for, page, lambda d: int(d.find_element(
                By.CSS_SELECTOR, "svg#rate-chart polyline").get_attribute("data-samples")) >= 15, 60.0)
        shot(page, "topic")
        last = int(text_of(page, "[data-field=last_seq_id]"))
        await asyncio.to_thread(wait_for, page, lambda d: int(text_of(d, "[data-field=last_seq_id]")) > last)
    finally:
        stop.set()
        sent = await asyncio.wait_for(producer, 20)
    assert sent > 0


@in_cluster
async def test_policies_are_shown_and_set_or_clearly_not_available(cluster: LocalCluster, page: Any,
                                                                   http: aiohttp.ClientSession) -> None:
    async with http.get(hub_url(cluster, 0) + "/admin/v1/policies") as resp:
        available = resp.status == 200
    page.get(ui(cluster, "/ui/policies"))
    if not available:        # a hub without the per-prefix policies resource says so, and the grants still work
        note = text_of(page, "#policies-note")
        assert note.startswith("Not available: per-prefix policies are not available on this hub")
        assert page.find_elements(By.ID, "policy-form") == [] and page.find_element(By.ID, "grant-form")
        return
    page.execute_script(f"sessionStorage.setItem('quire-admin-token', '{TOKEN}')")
    form = page.find_element(By.ID, "policy-form")
    form.find_element(By.NAME, "prefix").send_keys("ui-policy/")
    form.find_element(By.NAME, "settings").send_keys("message_ttl_seconds=3600")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait_for(page, lambda d: row(d, "policies", "ui-policy/") is not None)
    assert "3600" in row(page, "policies", "ui-policy/").text
    row(page, "policies", "ui-policy/").find_element(By.CSS_SELECTOR, "button[data-action=delete-policy]").click()
    wait_for(page, ec.alert_is_present()).accept()
    wait_for(page, lambda d: row(d, "policies", "ui-policy/") is None)


@in_cluster
async def test_the_script_formats_cells_as_the_templates_do(cluster: LocalCluster, page: Any) -> None:
    cases = [(None, "int"), (None, "text"), ("", "rate"), (12, "int"), (3.14159, "rate"), (0.6943, "pct"),
             (28.16, "ms"), (512, "bytes"), (82698842112, "bytes"), (3 * 2**40 * 1024, "bytes"),
             (1764286800123, "time"), (["b1", "b2"], "list"), ([1, 2, 3], "count"), (True, "bool"),
             ([{"address": "10.0.0.1:4080", "unacked": 3}], "consumers"), ([], "consumers"), (4, "consumers"),
             ({"message_ttl_seconds": 60}, "json"), ("<b>x</b>", "text")]
    page.get(ui(cluster, "/ui/bookies"))
    got = page.execute_script("return arguments[0].map((c) => window.quireConsole.format(c[0], c[1]))",
                              [list(c) for c in cases])
    assert got == [_format(v, f) for v, f in cases]


# --- changes, with and without the token ----------------------------------------------------------------
@in_cluster
async def test_reset_needs_the_token_and_shows_the_refusal(cluster: LocalCluster, page: Any,
                                                           http: aiohttp.ClientSession) -> None:
    topic = f"ui-reset-{uuid.uuid4().hex[:6]}"
    await make_topic(cluster, topic, 6, ("r1",))
    page.get(ui(cluster, f"/ui/topics/{topic}"))

    def reset_to(seq: int | str) -> None:
        page.execute_script("document.getElementById('message').textContent = ''")
        tr = row(page, "subscriptions", "r1")
        box = tr.find_element(By.CSS_SELECTOR, "input.seq")
        box.clear()
        box.send_keys(str(seq))
        tr.find_element(By.CSS_SELECTOR, "button[data-action=reset]").click()

    reset_to(2)                                           # no token: the page asks; the user cancels
    wait_for(page, ec.alert_is_present()).dismiss()
    wait_for(page, lambda d: "refused (401)" in text_of(d, "#message"))
    assert "missing or wrong Authorization" in text_of(page, "#message")
    assert (await stats(http, cluster, topic))[1]["subscriptions"]["r1"]["consumed_seq_id"] == 0

    reset_to(2)                                           # a wrong token: refused, and not kept
    alert = wait_for(page, ec.alert_is_present())
    alert.send_keys("not-the-token")
    alert.accept()
    wait_for(page, lambda d: "refused (401)" in text_of(d, "#message"))
    assert page.execute_script("return sessionStorage.getItem('quire-admin-token')") is None

    reset_to(9)                                           # the right token, a seq id past the end: 400 text
    alert = wait_for(page, ec.alert_is_present())
    alert.send_keys(TOKEN)
    alert.accept()
    wait_for(page, lambda d: "refused (400)" in text_of(d, "#message"))
    assert "past the topic's next seq id 7" in text_of(page, "#message")

    reset_to(4)                                           # the kept token: no question asked
    wait_for(page, lambda d: text_of(d, "#message") == "subscription r1 reset to seq id 4")
    assert no_alert(page)
    assert (await stats(http, cluster, topic))[1]["subscriptions"]["r1"]["consumed_seq_id"] == 3
    wait_for(page, lambda d: row(d, "subscriptions", "r1").find_elements(By.TAG_NAME, "td")[2].text == "3")

    reset_to("2100-01-01T00:00:00Z")                      # a time after the last message: the end
    wait_for(page, lambda d: text_of(d, "#message") == "subscription r1 reset to time 2100-01-01T00:00:00.000Z")
    assert (await stats(http, cluster, topic))[1]["subscriptions"]["r1"]["consumed_seq_id"] == 6
    reset_to("2000-01-01T00:00:00Z")                      # a time before the first: the first message
    wait_for(page, lambda d: text_of(d, "#message") == "subscription r1 reset to time 2000-01-01T00:00:00.000Z")
    assert (await stats(http, cluster, topic))[1]["subscriptions"]["r1"]["consumed_seq_id"] == 0
    reset_to("yesterday-ish")                             # neither a seq id nor a time: said, nothing sent
    wait_for(page, lambda d: "or a time such as" in text_of(d, "#message"))
    assert (await stats(http, cluster, topic))[1]["subscriptions"]["r1"]["consumed_seq_id"] == 0


@in_cluster
async def test_delete_asks_for_confirmation_and_the_token(cluster: LocalCluster, page: Any,
                                                          http: aiohttp.ClientSession) -> None:
    topic = f"ui-delete-{uuid.uuid4().hex[:6]}"
    await make_topic(cluster, topic, 2, ("keep", "gone"))
    page.get(ui(cluster, f"/ui/topics/{topic}"))

    def delete(sub: str) -> None:
        page.execute_script("document.getElementById('message').textContent = ''")
        row(page, "subscriptions", sub).find_element(By.CSS_SELECTOR, "button[data-action=delete-sub]").click()

    delete("gone")                                        # the confirmation, declined: nothing is sent
    wait_for(page, ec.alert_is_present()).dismiss()
    assert no_alert(page) and not page.find_element(By.ID, "message").is_displayed()

    delete("gone")                                        # confirmed, no token given
    wait_for(page, ec.alert_is_present()).accept()
    wait_for(page, ec.alert_is_present()).dismiss()       # the token question
    wait_for(page, lambda d: "refused (401)" in text_of(d, "#message"))
    assert set((await stats(http, cluster, topic))[1]["subscriptions"]) == {"keep", "gone"}

    delete("gone")                                        # confirmed, with the token
    wait_for(page, ec.alert_is_present()).accept()
    alert = wait_for(page, ec.alert_is_present())
    alert.send_keys(TOKEN)
    alert.accept()
    wait_for(page, lambda d: text_of(d, "#message") == "subscription gone deleted")
    wait_for(page, lambda d: row(d, "subscriptions", "gone") is None)
    assert set((await stats(http, cluster, topic))[1]["subscriptions"]) == {"keep"}

    page.find_element(By.CSS_SELECTOR, "button[data-action=release]").click()
    wait_for(page, lambda d: text_of(d, "#message").startswith("topic released by "))

    page.find_element(By.CSS_SELECTOR, "button[data-action=delete-topic]").click()
    wait_for(page, ec.alert_is_present()).accept()
    wait_for(page, lambda d: text_of(d, "#message") == f"topic {topic} deleted")
    assert (await stats(http, cluster, topic))[0] == 404


# --- names are text, unknown topics a clear page ---------------------------------------------------------
@in_cluster
async def test_names_are_escaped_everywhere(cluster: LocalCluster, page: Any) -> None:
    topic = f"<script>alert(1)</script>{uuid.uuid4().hex[:4]}"
    sub = "<img src=x onerror=alert(2)>"
    await make_topic(cluster, topic, 2, (sub,))
    page.get(ui(cluster))
    assert link_text(page, "topics", topic) == topic
    wait_for(page, polled)                                # the script's rendering too
    assert link_text(page, "topics", topic) == topic
    assert no_alert(page)
    assert page.execute_script("return document.querySelectorAll('main script, main img').length") == 0
    row(page, "topics", topic).find_element(By.TAG_NAME, "a").click()
    wait_for(page, lambda d: d.find_elements(By.ID, "topic-name"))
    assert text_of(page, "#topic-name") == topic and page.title == f"Topic {topic} · Quire console"
    assert row(page, "subscriptions", sub) is not None
    wait_for(page, polled)
    assert row(page, "subscriptions", sub).find_elements(By.TAG_NAME, "td")[0].text == sub
    assert no_alert(page)
    assert page.execute_script("return document.querySelectorAll('main script, main img').length") == 0


@in_cluster
async def test_a_topic_that_does_not_exist_is_a_clear_404_page(cluster: LocalCluster, page: Any,
                                                              http: aiohttp.ClientSession) -> None:
    name = f"no such {uuid.uuid4().hex[:6]}"
    url = ui(cluster, f"/ui/topics/{quote(name, safe='')}")
    async with http.get(url) as resp:
        body = await resp.text()
        assert resp.status == 404 and resp.content_type == "text/html"
        assert resp.headers["Content-Security-Policy"].startswith("default-src 'self'; script-src 'self'")
    assert "No such topic" in body and "Traceback" not in body
    page.get(url)
    assert text_of(page, "h1") == "No such topic" and text_of(page, "#topic-name") == name
    async with http.get(hub_url(cluster, 0) + "/healthz") as resp:       # and the hub goes on serving
        assert resp.status == 200


# --- behind a reverse proxy under a path prefix -----------------------------------------------------------
@contextlib.contextmanager
def prefix_proxy(target: str, prefix: str) -> Iterator[str]:
    """A reverse proxy on its own thread: ``PREFIX/...`` -> ``target/...`` (the prefix stripped), as nginx does."""
    ready: list[str] = []
    started = threading.Event()
    loop = asyncio.new_event_loop()

    async def forward(request: web.Request) -> web.StreamResponse:
        path = request.raw_path.removeprefix(prefix)
        if path == request.raw_path:
            return web.Response(status=404, text="outside the prefix")
        async with aiohttp.ClientSession() as s:
            async with s.request(request.method, target + path, data=await request.read(),
                                 headers={k: v for k, v in request.headers.items() if k.lower() != "host"},
                                 allow_redirects=False) as resp:
                return web.Response(body=await resp.read(), status=resp.status,
                                    headers={k: v for k, v in resp.headers.items()
                                             if k.lower() in ("content-type", "location")})

    async def serve() -> web.AppRunner:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", forward)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        ready.append(f"http://127.0.0.1:{runner.addresses[0][1]}")
        started.set()
        return runner

    def run() -> None:
        asyncio.set_event_loop(loop)
        runner = loop.run_until_complete(serve())
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert started.wait(10)
    try:
        yield ready[0] + prefix
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


@in_cluster
async def test_behind_a_path_prefix(cluster: LocalCluster, page: Any) -> None:
    topic = f"ui-prefix-{uuid.uuid4().hex[:6]}"
    await make_topic(cluster, topic, 1)
    with prefix_proxy(hub_url(cluster, 1), PREFIX) as base:
        page.get(base + "/ui/")
        assert page.title.startswith("Overview")
        hrefs = [a.get_attribute("href") for a in page.find_elements(By.CSS_SELECTOR, "header a")]
        assert hrefs and all(h.startswith(base + "/ui/") for h in hrefs), hrefs
        await asyncio.to_thread(wait_for, page, polled)      # the script's calls carry the prefix too
        assert row(page, "topics", topic) is not None
        page.find_element(By.LINK_TEXT, "Bookies").click()
        await asyncio.to_thread(wait_for, page, lambda d: d.current_url == base + "/ui/bookies")
        await asyncio.to_thread(wait_for, page, polled)
        assert row(page, "bookies", cluster.bookie_addresses[0]) is not None
        stylesheet = page.execute_script("return document.styleSheets[0].cssRules.length")
        assert stylesheet > 0                                 # /quire/ui/static/ was served


# --- delayed delivery and compaction on the topic page ------------------------------------------------------
@in_cluster
async def test_topic_page_shows_delayed_messages_and_compacts_with_the_token(cluster: LocalCluster, page: Any,
                                                                             http: aiohttp.ClientSession) -> None:
    topic = f"ui-compact-{uuid.uuid4().hex[:6]}"
    async with await HedwigClient.connect(cluster.hub_addresses[0]) as c:
        consumer = await c.consumer(topic.encode(), b"later", subscription_type="SHARED")
        async with consumer:
            for key, body in ((b"k1", b"a"), (b"k2", b"b"), (b"k1", b"c")):
                await c.publish(topic.encode(), body, key=key)
            for _ in range(3):
                await consumer.ack(await consumer.receive(timeout=WAIT))
            await c.publish(topic.encode(), b"in ten minutes", key=b"k3", deliver_after_ms=600_000)
            await c.publish(topic.encode(), b"in an hour", key=b"k3", deliver_at_ms=int(1000 * (time.time() + 3600)))
            page.get(ui(cluster, f"/ui/topics/{topic}"))
            delayed = page.execute_script("return Array.from(document.querySelectorAll('table#subscriptions th'))"
                                          ".findIndex((th) => th.dataset.field === 'delayed')")
            assert delayed > 0
            await asyncio.to_thread(wait_for, page, lambda d: row(d, "subscriptions", "later").find_elements(
                By.TAG_NAME, "td")[delayed].text == "2")            # both held, shown live by the script too
            assert (await stats(http, cluster, topic))[1]["subscriptions"]["later"]["delayed"] == 2
            assert text_of(page, "[data-field='compaction.ledger_id']") == "—"     # never compacted
            assert text_of(page, "[data-field='compaction.status']") == "idle"

            page.find_element(By.CSS_SELECTOR, "button[data-action=compact]").click()   # no token: refused
            await asyncio.to_thread(lambda: wait_for(page, ec.alert_is_present()).dismiss())
            await asyncio.to_thread(wait_for, page, lambda d: "refused (401)" in text_of(d, "#message"))
            assert (await stats(http, cluster, topic))[1]["compaction"]["ledger_id"] is None

            page.find_element(By.CSS_SELECTOR, "button[data-action=compact]").click()   # with the token
            alert = await asyncio.to_thread(wait_for, page, ec.alert_is_present())
            alert.send_keys(TOKEN)
            alert.accept()
            await asyncio.to_thread(wait_for, page, lambda d: text_of(d, "#message").startswith("topic compacted"))
            status = (await stats(http, cluster, topic))[1]["compaction"]
            assert status["compacted_up_to_seq_id"] == 5 and status["ledger_id"] and status["messages"] == 3
            assert text_of(page, "#message") == (f"topic compacted up to seq id 5 into ledger {status['ledger_id']}"
                                                 " (3 keys kept)")
            await asyncio.to_thread(wait_for, page, lambda d: text_of(
                d, "[data-field='compaction.compacted_up_to_seq_id']") == "5")
            assert text_of(page, "[data-field='compaction.ledger_id']") == str(status["ledger_id"])
            assert text_of(page, "[data-field='compaction.messages']") == "3"
            assert text_of(page, "[data-field='compaction.last_run_ms']").endswith(" UTC")
            assert text_of(page, "[data-field='compaction.pending_ledger_id']") == "—"
            page.refresh()                                   # the server's rendering shows the same
            assert text_of(page, "[data-field='compaction.compacted_up_to_seq_id']") == "5"
            assert row(page, "subscriptions", "later").find_elements(By.TAG_NAME, "td")[delayed].text == "2"

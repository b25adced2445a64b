"""The operator console in a real browser: Debian's headless Chromium driven by Selenium through
its packaged chromedriver (``apt-get install chromium chromium-driver``; nothing is downloaded).

The world is the demo's (``run_demo`` with the console around it, as ``demo --web`` does):
three fake clusters, the dispatcher, requests worked off, an outage, a drift. Then, in the
browser: log in, see the demo's backends, watch a request go from pending to succeeded
without a reload, run a reconcile pass and fix a drift, be refused an action as a viewer,
log out. Outside CI it skips with the reason when chromium or chromedriver is missing; in CI
(``CI`` set) it fails instead.

Screenshots of each page go to a temporary folder, or to the folder
``SYNNEFO_GANETI_CONSOLE_SCREENSHOTS`` names (``docs/console`` refreshes the docs' ones).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from synnefo_ganeti.config import WebSettings
from synnefo_ganeti.console import Console, hash_password
from synnefo_ganeti.store import InstanceStatus, RequestStatus
from synnefo_ganeti.testing._demo import BACKENDS, DemoWorld, run_demo
from tests.helpers import eventually, spec

pytestmark = pytest.mark.slow

CHROMIUM = os.environ.get("SYNNEFO_GANETI_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("SYNNEFO_GANETI_TEST_CHROMEDRIVER", "/usr/bin/chromedriver")
PASSWORDS = {"olga": "olga-operator-Pa55", "victor": "victor-viewer-Pa55"}
WAIT = 30.0


def _browser_problem() -> str | None:
    for path in (CHROMIUM, CHROMEDRIVER):
        if shutil.which(path) is None:
            return f"{path} is missing: apt-get install chromium chromium-driver"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is missing: pip install -e '.[test]'"
    return None


@pytest.fixture
def browser_ready() -> None:
    problem = _browser_problem()
    if problem is not None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the browser test: {problem}")
        pytest.skip(problem)


class Browser:
    """A headless Chromium (a fresh profile) and the console's base URL; blocking calls, run them
    in a thread (``await asyncio.to_thread(...)``) so that the world keeps running meanwhile."""

    def __init__(self, base: str, profile: Path, shots: Path) -> None:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for arg in (
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            f"--user-data-dir={profile}",
            "--window-size=1280,900",
        ):
            options.add_argument(arg)
        self.driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
        self.driver.set_page_load_timeout(WAIT)
        self.driver.set_script_timeout(WAIT)
        self.base = base
        self.shots = shots

    def close(self) -> None:
        self.driver.quit()

    def open(self, path: str) -> None:
        self.driver.get(self.base + path)

    def text(self) -> str:
        """The page's rendered text, read in one script in the page.

        No element handle is held between two WebDriver calls, so a live update or a navigation that
        replaces the body cannot leave a stale node in between (chromedriver reported that as "Node with
        given id does not belong to the document", an unknown error, not a stale reference). A script
        that ran while the document was unloading is read again.
        """
        from selenium.common.exceptions import WebDriverException

        last: WebDriverException | None = None
        for _ in range(20):
            try:
                return str(self.driver.execute_script("return document.body ? document.body.innerText : ''"))
            except WebDriverException as exc:
                last = exc
        raise AssertionError(f"the page's text could not be read: {last}")

    def until(self, predicate: Callable[[], Any], what: str) -> Any:
        from selenium.common.exceptions import StaleElementReferenceException
        from selenium.webdriver.support.ui import WebDriverWait

        return WebDriverWait(
            self.driver, WAIT, poll_frequency=0.05, ignored_exceptions=[StaleElementReferenceException]
        ).until(lambda _driver: predicate(), message=f"waiting for {what}")

    def click(self, css: str) -> None:
        """Click the element; again if a live update replaced it in between."""
        from selenium.common.exceptions import StaleElementReferenceException
        from selenium.webdriver.common.by import By

        def clicked() -> bool:
            try:
                self.driver.find_element(By.CSS_SELECTOR, css).click()
            except StaleElementReferenceException:
                return False
            return True

        self.until(clicked, f"a click on {css}")

    def badge(self, css: str) -> str:
        """The text of the first ``.badge`` in ``css`` ("" when absent), read in one script in the page."""
        script = "const e = document.querySelector(arguments[0]); return e ? e.innerText : ''"
        return str(self.driver.execute_script(script, f"{css} .badge"))

    def shot(self, name: str) -> None:
        self.driver.save_screenshot(str(self.shots / f"{name}.png"))

    def login(self, name: str) -> None:
        from selenium.webdriver.common.by import By

        self.open("/login")
        self.driver.find_element(By.ID, "username").send_keys(name)
        self.driver.find_element(By.ID, "password").send_keys(PASSWORDS[name])
        self.click("#login")
        self.until(lambda: self.driver.find_elements(By.ID, "user"), f"{name} logged in")

    def logout(self) -> None:
        self.click("#logout")
        self.until(lambda: "/login" in self.driver.current_url, "the login page after logout")

    def live(self) -> bool:
        return self.driver.execute_script("return document.documentElement.dataset.live") == "on"


@contextlib.asynccontextmanager
async def demo_with_console(tmp_path: Path) -> AsyncIterator[tuple[DemoWorld, str]]:
    """The demo's world (10 requests, 20 times faster), held open with the console on it."""
    users = tmp_path / "console.users"
    users.write_text(
        f"olga:operator:{hash_password(PASSWORDS['olga'])}\nvictor:viewer:{hash_password(PASSWORDS['victor'])}\n"
    )
    started: asyncio.Future[tuple[DemoWorld, str]] = asyncio.get_running_loop().create_future()
    release = asyncio.Event()

    @contextlib.asynccontextmanager
    async def around(world: DemoWorld) -> AsyncIterator[None]:
        web = WebSettings(users_file=users, secure_cookies=False)
        console = Console(
            world.settings.model_copy(update={"web": web}), store=world.store, capacity_interval=1.0
        )
        world.dispatcher.on_reconcile.append(console.reports.record)
        async with console.serve("127.0.0.1", 0) as url:
            holder["url"] = url
            yield

    async def hold(world: DemoWorld) -> None:
        started.set_result((world, holder["url"]))
        await release.wait()

    holder: dict[str, str] = {}
    demo = asyncio.create_task(run_demo(10, speed=20, timeout=90, around=around, hold=hold))
    await asyncio.wait([demo, started], return_when=asyncio.FIRST_COMPLETED)
    if demo.done():
        demo.result()  # raises what stopped it
        raise AssertionError("the demo ended before holding its world open")
    try:
        yield started.result()
    finally:
        release.set()
        report = await demo
        assert report.duplicates == 0 and report.lost == 0


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    """Where the screenshots go: $SYNNEFO_GANETI_CONSOLE_SCREENSHOTS, else a temporary folder."""
    folder = Path(os.environ.get("SYNNEFO_GANETI_CONSOLE_SCREENSHOTS") or tempfile.mkdtemp(dir=tmp_path))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


async def test_the_console_in_a_real_browser(browser_ready: None, shots: Path, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    async with demo_with_console(tmp_path) as (world, url):
        browser = await asyncio.to_thread(Browser, url, tmp_path / "profile", shots)
        try:
            await _scenario(browser, world, By)
        finally:
            await asyncio.to_thread(browser.close)


async def _scenario(b: Browser, world: DemoWorld, By: Any) -> None:
    run = asyncio.to_thread

    # nothing without a login: the login page, then the overview with the demo's backends
    await run(b.open, "/")
    assert "/login" in b.driver.current_url
    await run(b.shot, "login")
    await run(b.login, "olga")
    await run(b.until, lambda: all(f"backend-{x.name}" in b.driver.page_source for x in BACKENDS), "backends")
    await run(b.until, lambda: "memory" in b.text() and b.live(), "node stats and the live stream")
    text = b.text()
    assert all(backend.name in text for backend in BACKENDS) and "olga (operator)" in text
    await run(b.shot, "overview")
    await run(b.driver.set_window_size, 390, 844)  # a phone
    await run(b.shot, "overview-phone")
    await run(b.driver.set_window_size, 1280, 900)

    # a request from pending to succeeded, on the requests page, without a reload: every
    # backend's RAPI answers 503 first (health checks take them out of placement), so that it
    # stays pending until they answer again
    await run(b.open, "/requests")
    await run(b.until, b.live, "the live stream of the requests page")
    b.driver.execute_script("window.notReloaded = true")
    health = world.dispatcher.health
    assert health is not None
    for backend in BACKENDS:
        world.fakes[backend.name].inject_fault("503")
    await eventually(lambda: not any(health.tracker.is_up(x.name) for x in BACKENDS), what="all down")
    request_id = await world.cp.request_instance(spec("browser-vm"))
    world.dispatcher.wake()
    row = f"#request-{request_id}"

    def row_status() -> str:
        return b.badge(row)

    await run(b.until, lambda: row_status() == "pending", "the new request's row, pending")
    assert (await world.cp.get_request(request_id)).status is RequestStatus.PENDING
    for backend in BACKENDS:
        world.fakes[backend.name].clear_faults()
    world.dispatcher.wake()
    await run(b.until, lambda: row_status() == "succeeded", "the request's row turning succeeded")
    assert b.driver.execute_script("return window.notReloaded") is True  # the same page all along
    assert (await world.cp.get_request(request_id)).status is RequestStatus.SUCCEEDED
    await run(b.shot, "requests")

    # the request's, the instance's and the job's pages
    await run(b.click, f"{row} a")
    await run(b.until, lambda: "placement attempts" in b.text(), "the request's page")
    await run(b.shot, "request")
    await run(b.click, 'a[href^="/instances/"]')
    await run(b.until, lambda: "NICs" in b.text() and "browser-vm" in b.text(), "the instance's page")
    await run(b.shot, "instance")
    await run(b.open, "/instances")
    await run(b.until, lambda: "demo-0000" in b.text(), "the instances page")
    await run(b.shot, "instances")
    await run(b.open, "/jobs")
    await run(b.until, lambda: "OP_INSTANCE_CREATE" in b.text(), "the jobs page")
    await run(b.shot, "jobs")
    await run(b.click, "#rows tr a[href^='/jobs/']")
    await run(b.until, lambda: "Ops" in b.text() and "Log" in b.text(), "a job's page")
    await run(b.shot, "job")
    await run(b.open, "/backend-events")
    await run(b.until, lambda: "health checks failed" in b.text(), "the outage in the backend events")
    await run(b.shot, "backend-events")

    # a drift: shut down behind the control plane's back; run a pass, then fix it
    victims = await world.store.list_instances(backend="large", status=[InstanceStatus.STARTED])
    victim = victims[-1].name
    world.fakes["large"].cluster.instances[victim].oper_state = False
    await run(b.open, "/drift")
    await run(b.click, "#run-pass")
    await run(b.until, lambda: "reconcile pass (report only)" in b.text(), "the pass's report")
    assert victim in b.text() and "operstate" in b.text()
    await run(b.shot, "drift")
    await run(b.click, "#fix-large-operstate")
    await run(b.until, lambda: "fix operstate on large: 1 fixed" in b.text(), "the fix's message")
    stored = await world.store.get_instance("large", victim)
    assert stored is not None and stored.status is InstanceStatus.STOPPED
    await _operations(b, world, By)
    await run(b.logout)

    # a viewer: no action buttons, and an action sent anyway is refused
    await run(b.login, "victor")
    await run(b.open, "/drift")
    assert "victor (viewer: read only)" in b.text()
    assert not b.driver.find_element(By.ID, "run-pass").is_displayed()
    status = await run(
        b.driver.execute_async_script,
        """
        const done = arguments[arguments.length - 1];
        const body = new URLSearchParams({csrf: document.querySelector('meta[name="csrf-token"]').content});
        fetch('/drift/run', {method: 'POST', body})
          .then(async r => done([r.status, await r.text()]), e => done([0, String(e)]));
        """,
    )
    assert status[0] == 403 and "victor is a viewer" in status[1], status
    # a viewer sees the node and instance pages without their actions
    node = sorted(world.fakes["medium"].cluster.nodes)[-1]
    await run(b.open, f"/nodes/medium/{node}")
    await run(b.until, lambda: "Primary instances" in b.text(), "a node's page, as a viewer")
    for css in ("#node-drain", "#node-evacuate", "#node-failover"):
        assert not b.driver.find_element(By.CSS_SELECTOR, css).is_displayed(), css
    await run(b.open, "/audit")
    await run(b.until, lambda: "node-drain" in b.text(), "the audit log, as a viewer")
    await run(b.logout)
    await run(b.open, "/")
    assert "/login" in b.driver.current_url
    assert "alpha" not in b.driver.page_source and "drift" not in b.driver.current_url


async def _operations(b: Browser, world: DemoWorld, By: Any) -> None:
    """As an operator: the dispatcher on the overview, a node's page, its drain and evacuation from
    the page, an instance stopped and started from its page, the audit log and what needs attention."""
    run = asyncio.to_thread
    await run(b.open, "/")
    await run(
        b.until, lambda: "alive" in b.text() and world.dispatcher.id in b.text(), "the dispatcher's card"
    )
    await run(b.shot, "dispatchers")
    await run(b.open, "/nodes")
    await run(b.until, lambda: "medium" in b.text() and "as of" in b.text(), "the nodes page")
    await run(b.shot, "nodes")
    medium = world.fakes["medium"].cluster
    # the node (not the master) with the most primaries: the demo's instances are diskless, so
    # Ganeti moves none of them (the report says why for each)
    others = [name for name, n in medium.nodes.items() if not n.master]
    node = max(others, key=lambda name: sum(i.pnode == name for i in medium.instances.values()))
    await run(b.click, f'a[href="/nodes/medium/{node}"]')
    await run(b.until, lambda: "Primary instances" in b.text(), "the node's page")
    await run(b.click, "#node-drain")
    await run(b.until, lambda: f"drained node {node} on medium" in b.text(), "the drain's message")
    assert medium.nodes[node].drained
    await run(b.click, "#node-evacuate")
    await run(b.until, lambda: "Evacuate " in b.text(), "the evacuation's confirmation")
    await run(b.click, "#confirm-evacuate")
    await run(
        b.until,
        lambda: b.driver.find_elements(By.CSS_SELECTOR, '#node-work[data-running="no"]'),
        "the evacuation's report",
    )
    report = b.text()
    moved = sum(i.pnode == node for i in medium.instances.values())
    assert moved == 0 or "skipped" in report or "moved" in report, report
    await run(b.shot, "node")
    await run(b.click, "#node-undrain")
    await run(b.until, lambda: f"undrained node {node} on medium" in b.text(), "the undrain's message")
    assert not medium.nodes[node].drained

    started = await world.store.list_instances(status=[InstanceStatus.STARTED])
    target = started[0]
    await run(b.open, f"/instances/{target.id}")
    await run(b.click, "#instance-stop")
    await run(b.until, lambda: b.badge("#detail h1") == "STOPPED", "the instance stopped, live")
    await run(b.click, "#instance-start")
    await run(b.until, lambda: b.badge("#detail h1") == "STARTED", "the instance started again, live")
    await run(b.open, "/audit")
    await run(b.until, lambda: "instance-start" in b.text() and "node-evacuate" in b.text(), "the audit log")
    await run(b.shot, "audit")
    await run(b.open, "/attention")
    await run(
        b.until, lambda: "Failed jobs" in b.text() and "Requests waiting" in b.text(), "needs attention"
    )
    await run(b.shot, "attention")

"""The management web UI in a real browser: Debian's headless Chromium driven by selenium
(chromedriver), against a real broker, as a person would use it.

Logs in, watches a queue that a pika client declares appear with its depth (the page refreshes
every 5 s), opens the queue's page, publishes a message from the page, gets it back (its payload
shown), purges the queue (depth 0) and deletes it; then opens every other tab. Screenshots at
1280x800 are kept under $SHOAL_TEST_ARTIFACTS (or the test's tmp_path), and the path is printed.
The test skips, saying why, without chromium, chromedriver or selenium.
"""

from __future__ import annotations

import os
import shutil
import struct
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pika
import pytest

from tests.integration.harness import HOST, Broker, close_quietly, finish, show_log_if_failed
from tests.integration.management_helpers import HTTP, start_with_management

WAIT_S = 20.0  # bounded waits: four refreshes of the page
QUEUE = "ui.orders"


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    pytest.skip("the UI's browser test needs Chromium (Debian: apt-get install chromium; .ci/run installs it)")


def _chromedriver() -> str:
    found = shutil.which("chromedriver")
    if not found:
        pytest.skip("the UI's browser test needs chromedriver (Debian: apt-get install chromium-driver; "
                    ".ci/run installs it)")
    return found


webdriver = pytest.importorskip(
    "selenium.webdriver", reason="the UI's browser test needs selenium (pip install -e '.[test]')")
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


@pytest.fixture
def artifacts(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    root = os.environ.get("SHOAL_TEST_ARTIFACTS")
    where = (Path(root) / "management-ui") if root else (tmp_path / "screenshots")
    where.mkdir(parents=True, exist_ok=True)
    print(f"\nscreenshots of the management UI: {where}")
    return where


@pytest.fixture
def managed_broker(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[Broker, int]]:
    broker, port = start_with_management(tmp_path / "broker")
    try:
        yield broker, port
    finally:
        show_log_if_failed(request, broker)
        finish(broker)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    chromium, chromedriver = _chromium(), _chromedriver()
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    # as root (CI) Chromium needs --no-sandbox; the background-networking flags keep it from
    # reaching for Google's hosts on a machine without a network
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--no-first-run", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--window-size=1280,800", "--force-device-scale-factor=1",
                 "--hide-scrollbars", f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = webdriver.ChromeService(executable_path=chromedriver, log_output=str(tmp_path / "chromedriver.log"))
    driver = webdriver.Chrome(options=options, service=service)
    driver.set_page_load_timeout(30)
    driver.set_script_timeout(30)
    # a 1280x800 page: the window is larger by what the browser's own frame takes
    frame_w, frame_h = driver.execute_script(
        "return [window.outerWidth - window.innerWidth, window.outerHeight - window.innerHeight]")
    driver.set_window_size(1280 + frame_w, 800 + frame_h)
    try:
        yield driver
    finally:
        driver.quit()


def wait(driver: Any, what: str, predicate: Callable[[Any], Any], timeout: float = WAIT_S) -> Any:
    try:
        # The page redraws its tables every 5 s: an element found a moment ago may be gone.
        return WebDriverWait(driver, timeout, poll_frequency=0.2,
                             ignored_exceptions=(StaleElementReferenceException,)).until(predicate)
    except TimeoutException:
        shot = getattr(driver, "failure_shot", None)
        if shot is not None:
            driver.save_screenshot(str(shot))
        logs = "\n".join(e["message"] for e in driver.get_log("browser"))
        raise AssertionError(f"timed out after {timeout:g} s waiting for {what} (screenshot: {shot});"
                             f" the browser's console:\n{logs}\nthe page:\n{text_of(driver, 'body')}"
                             ) from None


def text_of(driver: Any, css: str) -> str:
    """The element's text; "" when there is none, or it was redrawn while being read."""
    try:
        found = driver.find_elements(By.CSS_SELECTOR, css)
        return found[0].text if found else ""
    except StaleElementReferenceException:
        return ""


def queue_row_total(driver: Any, name: str) -> str | None:
    try:
        rows = driver.find_elements(By.CSS_SELECTOR, f'#queues-table tr[data-name="{name}"] td.c-total')
        return rows[0].text if rows else None
    except StaleElementReferenceException:  # redrawn while being read
        return None


def png_size(path: Path) -> tuple[int, int]:
    width, height = struct.unpack(">II", path.read_bytes()[16:24])  # the IHDR chunk
    return width, height


def shoot(driver: Any, where: Path, name: str) -> None:
    driver.execute_script("window.scrollTo(0, 0)")
    path = where / f"{name}.png"
    assert driver.save_screenshot(str(path)), path
    assert png_size(path) == (1280, 800), (path, png_size(path))


def shoot_element(driver: Any, where: Path, name: str, css: str) -> None:
    """A screenshot with ``css`` scrolled to the top of the window (the page's lower sections)."""
    driver.execute_script("document.querySelector(arguments[0]).scrollIntoView({block: 'start'})", css)
    assert driver.save_screenshot(str(where / f"{name}.png"))


def click(driver: Any, by: str, selector: str) -> None:
    """Find and click, again if the element was redrawn in between (bounded by wait)."""
    def clicked(d: Any) -> bool:
        d.find_element(by, selector).click()
        return True
    wait(driver, f"{selector} to be clicked", clicked)


def fill(driver: Any, element_id: str, text: str) -> None:
    element = driver.find_element(By.ID, element_id)
    element.clear()
    element.send_keys(text)


def accept_confirm(driver: Any) -> None:
    alert = wait(driver, "the confirm dialog", lambda d: d.switch_to.alert)
    alert.accept()


@pytest.mark.deadline(150)
def test_a_person_manages_a_queue_in_the_web_ui(managed_broker: tuple[Broker, int], browser: Any,
                                                artifacts: Path) -> None:
    broker, port = managed_broker
    http = HTTP(port)
    driver = browser
    driver.failure_shot = artifacts / "failure.png"
    base = f"http://{HOST}:{port}/"

    # the login form; a wrong password is refused on the form, the right one lets us in
    driver.get(base)
    wait(driver, "the login form", lambda d: d.find_element(By.ID, "login-form").is_displayed())
    shoot(driver, artifacts, "01-login")
    fill(driver, "login-username", "guest")
    fill(driver, "login-password", "wrong")
    click(driver, By.ID, "login-submit")
    wait(driver, "the login error", lambda d: "Login failed" in text_of(d, "#login-error"))
    fill(driver, "login-password", "guest")
    click(driver, By.ID, "login-submit")
    wait(driver, "the overview", lambda d: d.find_element(By.ID, "totals").text.strip())
    assert driver.execute_script("return sessionStorage.getItem('shoal.auth')") is not None
    assert text_of(driver, "#fact-user") == "guest"
    assert "none" in text_of(driver, "#node-facts td.alarms")

    # the Queues tab, then a pika client declares a queue and publishes two messages: the page
    # shows it, with its depth, at a refresh (no reload)
    click(driver, By.CSS_SELECTOR, '#tabs a[data-tab="queues"]')
    wait(driver, "the queues table", lambda d: d.find_elements(By.ID, "queues-table"))
    connection = pika.BlockingConnection(pika.ConnectionParameters(HOST, broker.port))
    try:
        channel = connection.channel()
        channel.queue_declare(QUEUE, durable=True)
        for i in (1, 2):
            channel.basic_publish("", QUEUE, f"from pika {i}".encode())
        wait(driver, f"{QUEUE} with 2 messages on the Queues page",
             lambda d: queue_row_total(d, QUEUE) == "2")
        shoot(driver, artifacts, "02-queues")
    finally:
        close_quietly(connection)

    # the queue's page
    click(driver, By.CSS_SELECTOR, f'#queues-table tr[data-name="{QUEUE}"] td.name a')
    wait(driver, "the queue's page", lambda d: text_of(d, "#queue-total") == "2")
    assert driver.current_url.endswith("#/queues/%2F/" + urllib.parse.quote(QUEUE, safe=""))
    assert text_of(driver, "#queue-title") == QUEUE
    shoot(driver, artifacts, "03-queue")

    # publish a message from the page
    fill(driver, "publish-payload", "hello from the page")
    fill(driver, "publish-properties", '{"content_type": "text/plain"}')
    click(driver, By.ID, "publish-submit")
    wait(driver, "the publish result", lambda d: text_of(d, "#publish-result") == "Message published.")
    wait(driver, "a depth of 3", lambda d: text_of(d, "#queue-total") == "3")
    assert http.get(f"/api/queues/%2F/{QUEUE}")["messages"] == 3

    # get the messages back (requeued): the page's own message is the third, payload shown
    fill(driver, "get-count", "3")
    click(driver, By.ID, "get-submit")
    wait(driver, "three messages got", lambda d: len(d.find_elements(By.CSS_SELECTOR, "#get-messages .message")) == 3)
    payloads = [e.text for e in driver.find_elements(By.CSS_SELECTOR, "#get-messages pre.payload")]
    assert payloads == ["from pika 1", "from pika 2", "hello from the page"]
    assert "text/plain" in driver.find_elements(By.CSS_SELECTOR, "#get-messages .message")[2].text
    shoot_element(driver, artifacts, "04-get-messages", "#get-submit")
    wait(driver, "the depth after a requeueing get", lambda d: text_of(d, "#queue-total") == "3")

    # purge: depth 0
    click(driver, By.ID, "queue-purge")
    accept_confirm(driver)
    wait(driver, "the purge result", lambda d: "purged" in text_of(d, "#danger-result"))
    wait(driver, "a depth of 0", lambda d: text_of(d, "#queue-total") == "0")
    assert http.get(f"/api/queues/%2F/{QUEUE}")["messages"] == 0
    shoot_element(driver, artifacts, "05-purged", "#queue-purge")

    # delete: back on the Queues page, the queue gone
    click(driver, By.ID, "queue-delete")
    accept_confirm(driver)
    wait(driver, "the Queues page again", lambda d: d.current_url.endswith("#/queues"))
    wait(driver, "the deletion notice", lambda d: "deleted" in text_of(d, "#flash"))
    wait(driver, f"{QUEUE} gone from the table", lambda d: d.find_elements(By.ID, "queues-table")
         and queue_row_total(d, QUEUE) is None)
    assert http.request("GET", f"/api/queues/%2F/{QUEUE}")[0] == 404
    shoot(driver, artifacts, "06-deleted")

    # every other tab renders from the API; a client with a consumer is on the Connections and
    # Channels pages
    consumer = pika.BlockingConnection(pika.ConnectionParameters(
        HOST, broker.port, client_properties={"product": "ui-test-consumer"}))
    try:
        channel = consumer.channel()
        channel.queue_declare("ui.watched", exclusive=True)
        channel.basic_consume("ui.watched", lambda *args: None)
        for tab, css, expected in (("connections", "#connections table", "ui-test-consumer"),
                                   ("channels", "#channels table", "guest"),
                                   ("exchanges", "#exchanges-table", "amq.topic"),
                                   ("admin", "#admin-users table", "guest")):
            click(driver, By.CSS_SELECTOR, f'#tabs a[data-tab="{tab}"]')
            wait(driver, f"the {tab} page", lambda d, css=css, expected=expected: expected in text_of(d, css))
            shoot(driver, artifacts, f"07-{tab}")
        # an exchange's page, from its link
        click(driver, By.CSS_SELECTOR, '#tabs a[data-tab="exchanges"]')
        click(driver, By.CSS_SELECTOR, '#exchanges-table tr[data-name="amq.topic"] a')
        wait(driver, "amq.topic's page", lambda d: "topic" in text_of(d, "#exchange-details"))
        shoot(driver, artifacts, "07-exchange")
    finally:
        close_quietly(consumer)
    click(driver, By.CSS_SELECTOR, '#tabs a[data-tab="overview"]')
    # the charts draw lines once the page has two samples (one every 5 s)
    wait(driver, "the overview's charts", lambda d: d.find_elements(By.CSS_SELECTOR, "#chart-queued polyline.series")
         and d.find_elements(By.CSS_SELECTOR, "#chart-rates polyline.series"))
    shoot(driver, artifacts, "08-overview")
    shoot_element(driver, artifacts, "09-overview-node", "#node")

    # no script error in the whole session
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"
              and "401" not in e["message"]]  # the refused login: Chromium logs the failed fetch
    assert not errors, errors

    # logging out forgets the credentials
    click(driver, By.ID, "logout")
    wait(driver, "the login form again", lambda d: d.find_element(By.ID, "login-form").is_displayed())
    assert driver.execute_script("return sessionStorage.getItem('shoal.auth')") is None

"""The chat page at ``/`` in a real browser (Debian's chromium driven by playwright): sending
with Enter, streaming into an Answer, reasoning in a collapsible element, Stop, New chat,
settings, the conversation kept across a reload, the API key asked for on 401, nothing
fetched from another host, no console errors; ``serve --no-webui`` leaves ``/`` a 404."""

from __future__ import annotations

import os
import shutil
import time

import pytest

from conftest import model_for
from test_server import Running, ScriptedModel

playwright = pytest.importorskip("playwright.sync_api")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None:
    if os.environ.get("CI"):
        raise RuntimeError("CI installs Debian's chromium for these tests (.ci/run)")
    pytest.skip("no chromium on this machine", allow_module_level=True)


@pytest.fixture(scope="module")
def browser():
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


class Page:
    """A page with its console errors, uncaught exceptions and requests to other hosts."""

    def __init__(self, browser, url):
        self.url = url
        self.ctx = browser.new_context()
        self.pg = self.ctx.new_page()
        self.errors, self.foreign = [], []
        self.pg.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.pg.on("pageerror", lambda e: self.errors.append(str(e)))
        self.pg.on(
            "request",
            lambda r: (
                self.foreign.append(r.url)
                if not (r.url.startswith(url) or r.url.startswith("data:"))
                else None
            ),
        )
        self.pg.goto(url + "/")

    def send(self, text):
        box = self.pg.get_by_role("textbox", name="Message")
        box.fill(text)
        box.press("Enter")

    def answers(self):
        return self.pg.get_by_role("article", name="Assistant message")

    def wait_answers(self, n):
        self.pg.wait_for_function(
            f"document.querySelectorAll('article[aria-label=\"Assistant message\"] .stats')"
            f".length >= {n} && [...document.querySelectorAll('article[aria-label=\"Assistant "
            f"message\"] .stats')][{n - 1}].textContent.length > 0",
            timeout=30_000,
        )

    def close(self, allow_401=False):
        errors = [e for e in self.errors if not (allow_401 and "401" in e)]
        self.ctx.close()
        assert errors == [] and self.foreign == [], (errors, self.foreign)


def test_chat_page_on_the_demo(browser, tmp_path):
    s = Running(model_for("tiny-a"), name="demo", max_tokens=12)
    try:
        p = Page(browser, s.url)
        pg = p.pg
        # Shift+Enter is a new line, Enter sends
        box = pg.get_by_role("textbox", name="Message")
        box.fill("Hello")
        box.press("Shift+Enter")
        assert box.input_value() == "Hello\n"
        box.press("Enter")
        p.wait_answers(1)
        user = pg.get_by_role("article", name="User message")
        assert user.count() == 1 and "Hello" in user.inner_text()
        a = p.answers().last
        answer = a.get_by_label("Answer")
        assert answer.inner_text().strip()
        stats = a.locator(".stats").inner_text()
        assert "tok/s" in stats and "cached" in stats
        assert pg.get_by_role("button", name="Stop").is_hidden()
        # settings take effect when changed and survive a reload, as does the conversation
        pg.get_by_role("button", name="Settings").click()
        pg.get_by_label("Temperature").fill("0")
        pg.get_by_label("Max tokens").fill("5")
        pg.get_by_label("System prompt").fill("Be brief.")
        pg.keyboard.press("Escape")
        p.send("Again")
        p.wait_answers(2)
        pg.screenshot(path=str(tmp_path / "page.png"))
        pg.reload()
        assert pg.get_by_role("article", name="User message").count() == 2
        assert p.answers().count() == 2
        pg.get_by_role("button", name="Settings").click()
        assert pg.get_by_label("Temperature").input_value() == "0"
        assert pg.get_by_label("System prompt").input_value() == "Be brief."
        pg.get_by_role("button", name="Close").click()
        # the answer's text is text: model output cannot inject markup
        assert pg.locator("article script, article img, article iframe").count() == 0
        pg.get_by_role("button", name="New chat").click()
        assert pg.get_by_role("article").count() == 0
        p.close()
    finally:
        s.close()


def test_reasoning_collapses_and_stop_aborts(browser):
    fake = ScriptedModel("Thinking <b>hard</b> here.</think>The answer.")
    s = Running(fake, name="scripted")
    try:
        p = Page(browser, s.url)
        pg = p.pg
        pg.get_by_role("button", name="Settings").click()
        pg.get_by_label("Thinking").check()
        pg.get_by_role("button", name="Close").click()
        p.send("Why?")
        p.wait_answers(1)
        a = p.answers().last
        reasoning = a.get_by_label("Reasoning")
        assert "Thinking <b>hard</b> here." in reasoning.text_content()
        assert a.get_by_label("Answer").inner_text().strip() == "The answer."
        assert "Thinking" not in a.get_by_label("Answer").inner_text()
        details = a.locator("details")
        details.locator("summary").click()
        assert details.evaluate("d => d.open") is True
        details.locator("summary").click()
        assert details.evaluate("d => d.open") is False
        p.close()
    finally:
        s.close()
    endless = ScriptedModel("la ", endless=True, delay=0.02)
    s = Running(endless, name="endless")
    try:
        p = Page(browser, s.url)
        pg = p.pg
        p.send("Go on forever")
        stop = pg.get_by_role("button", name="Stop")
        stop.wait_for(state="visible")
        assert stop.is_enabled()
        time.sleep(0.5)
        stop.click()
        pg.get_by_role("button", name="Send").wait_for(state="visible")
        # the server cancelled the request (the client went away)
        end = time.time() + 10
        while not any(" 499 " in x for x in s.logs) and time.time() < end:
            time.sleep(0.05)
        assert any(" 499 " in x for x in s.logs), s.logs
        p.close()
    finally:
        s.close()


def test_the_page_asks_for_the_api_key(browser):
    s = Running(model_for("tiny-a"), name="demo", api_key="sekret", max_tokens=3)
    try:
        p = Page(browser, s.url)  # the page itself loads without a key
        pg = p.pg
        p.send("Hello")
        key = pg.get_by_label("API key")
        key.wait_for(state="visible")
        key.fill("wrong")
        key.press("Enter")
        time.sleep(0.5)
        key.wait_for(state="visible")  # asked again
        key.fill("sekret")
        key.press("Enter")
        p.wait_answers(1)
        assert pg.get_by_label("API key").is_hidden()
        p.close(allow_401=True)  # the browser itself logs each 401 response
    finally:
        s.close()


def test_no_webui_is_a_404():
    import httpx

    s = Running(model_for("tiny-a"), name="demo", webui=False)
    try:
        assert httpx.get(s.url + "/", timeout=10).status_code == 404
    finally:
        s.close()
    s = Running(model_for("tiny-a"), name="demo")
    try:
        r = httpx.get(s.url + "/", timeout=10)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        assert "connect-src 'self'" in r.headers["content-security-policy"]
        # no address of another host in it (the SVG namespace is a name, not a request)
        text = r.text.replace("http://www.w3.org/2000/svg", "")
        assert "http://" not in text and "https://" not in text and "//cdn" not in text
    finally:
        s.close()

"""The chat page in headless Debian Chromium against a real server: a streamed answer, stop
during a long generation, regenerate and edit, conversations kept across a reload; and, from a
stream the test controls, markdown with a highlighted, copyable code block in which HTML from
the model cannot run. Screenshots go to tests/artifacts/.

Needs the Debian packages chromium and chromium-driver (see .ci/apt-packages.txt) and the
Python package selenium; without the browser the test is skipped and says why.
"""
import shutil
import time

import pytest
from server_process import ARTIFACTS, browser_server

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")

pytestmark = pytest.mark.skipif(
    not (CHROMIUM and CHROMEDRIVER),
    reason="headless browser test needs Debian's chromium and chromium-driver "
           "(apt-get install -y chromium chromium-driver)")


@pytest.fixture(scope="module")
def server():
    return browser_server()


@pytest.fixture(scope="module")
def browser(server):
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic", "--window-size=420,900"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    # Headless windows never have focus, which the clipboard API requires.
    driver.execute_cdp_cmd("Emulation.setFocusEmulationEnabled", {"enabled": True})
    yield driver
    driver.quit()


def wait_for(predicate, timeout_s: float = 30.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what() if callable(what) else what}")


def set_field(driver, field_id: str, value: str) -> None:
    el = driver.find_element("id", field_id)
    el.clear()
    el.send_keys(value)


def ask(driver, text: str):
    """Send a message; returns the new answer element (not the previous one: the click may
    return before the page has added it)."""
    before = len(driver.find_elements("css selector", ".msg.assistant"))
    driver.find_element("id", "prompt").send_keys(text)
    driver.find_element("id", "send").click()
    answers = wait_for(lambda: driver.find_elements("css selector", ".msg.assistant")[before:],
                       10, "the answer element")
    return answers[0]


# The test model has random weights and may emit its end-of-text token at any point; a long
# generation to stop needs `ignore_eos`, which the page (rightly) never sends. So the test adds
# it to the page's own fetch body; streaming, abort and rendering stay the page's code.
IGNORE_EOS_JS = """
const realFetch = window.fetch;
window.fetch = (url, init) => {
  if (String(url).endsWith("/v1/chat/completions") && init && init.body) {
    init = {...init, body: JSON.stringify({...JSON.parse(init.body), ignore_eos: true})};
  }
  return realFetch(url, init);
};
"""


def answer_text(answer) -> str:
    return answer.find_element("css selector", ".content").text


def test_chat_page_streams_an_answer_and_stops(browser, server):
    browser.get(server.url + "/")
    wait_for(lambda: "Model:" in browser.find_element("id", "model-status").text, 30,
             "the page to load the model name")
    # Accessibility basics: every setting has a label, the conversation is a live region.
    log = browser.find_element("id", "conversation")
    assert log.get_attribute("aria-live") == "polite" and log.get_attribute("role") == "log"
    for field_id in ("system-prompt", "temperature", "max-tokens", "thinking", "prompt"):
        assert browser.find_elements("css selector", f"label[for='{field_id}']"), field_id

    browser.find_element("css selector", "#settings summary").click()
    set_field(browser, "temperature", "0")
    set_field(browser, "max-tokens", "40")
    thinking = browser.find_element("id", "thinking")
    if thinking.is_selected():
        thinking.click()  # thinking off: the answer is content, not reasoning

    browser.find_element("css selector", "#settings summary").click()  # close settings again

    answer = ask(browser, "Hello! Who are you?")
    wait_for(lambda: answer_text(answer), 30, "streamed text to appear")
    wait_for(lambda: answer.get_attribute("data-state") == "done", 60, "the answer to finish")
    assert answer_text(answer)
    stats = answer.find_element("css selector", ".stats").text
    assert "tokens/s" in stats and "first token after" in stats
    assert stats.split(" tokens")[0].strip().isdigit()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / "browser_chat_answer.png"))

    # A long generation (max tokens left empty: up to the 4K context), stopped half-way.
    browser.find_element("css selector", "#settings summary").click()
    browser.find_element("id", "max-tokens").clear()
    browser.find_element("css selector", "#settings summary").click()
    base = server.wait_idle()
    browser.execute_script(IGNORE_EOS_JS)
    answer = ask(browser, "Now tell me a very long story.")
    assert browser.find_element("id", "stop").is_enabled(), (answer.get_attribute("data-state"),
                                                             answer.text)
    wait_for(lambda: answer_text(answer), 60, "a long answer to start streaming")
    browser.find_element("id", "stop").click()
    wait_for(lambda: answer.get_attribute("data-state") == "stopped", 10,
             lambda: f"the stop to land (state {answer.get_attribute('data-state')!r}, "
                     f"engine {server.stats()})")
    stopped_text = answer_text(answer)
    assert stopped_text.endswith("[stopped]")
    after = server.wait_idle(timeout_s=10)  # the server cancelled the request
    assert after["kv_pages_free"] == base["kv_pages_free"]
    assert 0 < after["generated_tokens"] - base["generated_tokens"] < 3000
    time.sleep(0.5)
    assert answer_text(answer) == stopped_text  # nothing arrives after stop
    assert browser.find_element("id", "send").is_enabled()
    assert not browser.find_element("id", "stop").is_enabled()
    browser.execute_script("arguments[0].scrollIntoView({block: 'end'})", answer)
    browser.save_screenshot(str(ARTIFACTS / "browser_chat_stopped.png"))


def open_fresh_page(browser, server, temperature="0", max_tokens="40", thinking=False):
    """The page with no stored conversations and known settings."""
    browser.get(server.url + "/")
    browser.execute_script("localStorage.clear()")
    browser.refresh()
    wait_for(lambda: "Model:" in browser.find_element("id", "model-status").text, 30,
             "the page to load the model name")
    browser.find_element("css selector", "#settings summary").click()
    set_field(browser, "temperature", temperature)
    set_field(browser, "max-tokens", max_tokens)
    if browser.find_element("id", "thinking").is_selected() != thinking:
        browser.find_element("id", "thinking").click()
    browser.find_element("css selector", "#settings summary").click()


def severe_console_messages(browser) -> list[str]:
    return [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]


def test_page_loads_without_console_errors_and_has_a_favicon(browser, server):
    browser.get_log("browser")  # drop earlier tests' messages
    open_fresh_page(browser, server)
    assert severe_console_messages(browser) == []  # no 404 (favicon, vendor files), no JS error
    icon = browser.find_element("css selector", "link[rel=icon]").get_attribute("href")
    for url in (icon, server.url + "/favicon.ico"):
        resp = server.get(url.removeprefix(server.url))
        assert resp.status_code == 200 and resp.headers["Content-Type"].startswith("image/svg+xml")
    header = browser.find_element("css selector", "header.top")
    assert header.value_of_css_property("position") == "sticky"


# A stream the page cannot tell from the server's: reasoning, then (once the test calls
# window.__release()) an answer with a code block and three ways HTML could try to run,
# cut into 7-character chunks so that fences and tags arrive in pieces.
FAKE_STREAM_JS = """
const [reasoning, content] = arguments;
const encoder = new TextEncoder();
const pieces = (text) => text.match(/[\\s\\S]{1,7}/g);
let release;
const gate = new Promise((resolve) => { release = resolve; });
window.__release = release;
window.__pwned = undefined;
const realFetch = window.fetch;
window.fetch = (url, init) => {
  if (!String(url).endsWith("/v1/chat/completions")) return realFetch(url, init);
  const body = new ReadableStream({ async start(controller) {
    const send = (obj) => controller.enqueue(encoder.encode("data: " + JSON.stringify(obj) + "\\n\\n"));
    const pause = () => new Promise((resolve) => setTimeout(resolve, 5));
    for (const p of pieces(reasoning)) { send({choices: [{index: 0, delta: {reasoning_content: p}}]}); await pause(); }
    await gate;
    for (const p of pieces(content)) { send({choices: [{index: 0, delta: {content: p}}]}); await pause(); }
    send({choices: [], usage: {completion_tokens: 57}});
    controller.enqueue(encoder.encode("data: [DONE]\\n\\n"));
    controller.close();
  }});
  return Promise.resolve(new Response(body, {status: 200, headers: {"Content-Type": "text/event-stream"}}));
};
"""
CODE = 'def add(a, b):\n    """Sum of two numbers."""\n    return a + b\n\nprint(add(2, 3))'
ANSWER = ("Here is **the function**:\n\n```python\n" + CODE + "\n```\n\n"
          "<script>window.__pwned = 'script';</script>\n"
          '<img src="nope.png" onerror="window.__pwned = \'onerror\'">\n\n'
          "[a link](javascript:window.__pwned='link') and `inline code`. ![a chart](/chart.png)")


def test_markdown_code_block_is_highlighted_copyable_and_html_cannot_run(browser, server):
    open_fresh_page(browser, server, thinking=True)
    browser.execute_cdp_cmd("Browser.grantPermissions", {
        "origin": server.url, "permissions": ["clipboardReadWrite", "clipboardSanitizedWrite"]})
    browser.execute_script(FAKE_STREAM_JS, "Let me write a small Python function.", ANSWER)
    answer = ask(browser, "Write an add function in Python.")
    box = wait_for(lambda: answer.find_elements("css selector", "details.reasoning"), 10, "the Thinking box")[0]
    wait_for(lambda: "small Python function" in box.text, 10, "the reasoning to stream")
    assert box.get_attribute("open") is not None  # open while the model thinks
    browser.execute_script("window.__release()")
    wait_for(lambda: answer.get_attribute("data-state") == "done", 20, "the answer to finish")
    assert box.get_attribute("open") is None  # folded once the answer started

    content = answer.find_element("css selector", ".content")
    assert content.find_element("css selector", "strong").text == "the function"
    code = content.find_element("css selector", ".code-block pre code.hljs")
    assert code.text == CODE  # the code as written, highlighted into spans
    keywords = [k.text for k in code.find_elements("css selector", ".hljs-keyword")]
    assert "def" in keywords and "return" in keywords, keywords
    assert code.find_elements("css selector", ".hljs-string")  # the docstring
    assert "monospace" in code.value_of_css_property("font-family")
    assert content.find_element("css selector", ".code-lang").text == "python"
    assert content.find_element("css selector", "p code").text == "inline code"

    # Nothing from the model ran or survived sanitizing; a click on the link does nothing either.
    assert browser.execute_script("return window.__pwned") is None
    assert not content.find_elements("css selector", "script, img, [onerror]")
    assert content.find_element("link text", "a chart").get_attribute("href") == server.url + "/chart.png"
    link = content.find_element("link text", "a link")
    assert not (link.get_attribute("href") or "").startswith("javascript:")
    link.click()
    browser.switch_to.window(browser.window_handles[0])
    assert browser.execute_script("return window.__pwned") is None

    copy = content.find_element("css selector", ".code-head button.copy")
    copy.click()
    wait_for(lambda: copy.text == "Copied", 5, lambda: f"the copy to land (button says {copy.text!r})")
    clipboard = browser.execute_async_script(
        "navigator.clipboard.readText().then(arguments[0], (e) => arguments[0]('error: ' + e))")
    assert clipboard == CODE
    browser.execute_script("arguments[0].scrollIntoView({block: 'start'})", answer)
    browser.save_screenshot(str(ARTIFACTS / "browser_chat_code.png"))
    assert severe_console_messages(browser) == []  # nothing was fetched for the image either


def stored_conversations(browser) -> list[dict]:
    return browser.execute_script("return JSON.parse(localStorage.getItem('pyengine.conversations') || '[]')")


def messages_on_page(browser) -> list[tuple[str, str]]:
    return [("user" if "user" in el.get_attribute("class") else "assistant",
             el.find_element("css selector", ".content").text)
            for el in browser.find_elements("css selector", "#conversation .msg")]


RECORD_REQUESTS_JS = """
window.__requests = [];
const realFetch = window.fetch;
window.fetch = (url, init) => {
  if (String(url).endsWith("/v1/chat/completions")) window.__requests.push(JSON.parse(init.body));
  return realFetch(url, init);
};
"""


def test_regenerate_edit_and_conversations_survive_a_reload(browser, server):
    open_fresh_page(browser, server)
    browser.execute_script(RECORD_REQUESTS_JS)
    first = ask(browser, "What is 23 + 45?")
    wait_for(lambda: first.get_attribute("data-state") == "done", 60, "the first answer")
    first_text = answer_text(first)
    assert first_text

    # Regenerate: the same question again (greedy, so the same answer), the old answer replaced.
    first.find_element("css selector", "button.regenerate").click()
    wait_for(lambda: len(browser.execute_script("return window.__requests")) == 2, 10, "the regenerate request")
    again = wait_for(lambda: [a for a in browser.find_elements("css selector", ".msg.assistant")
                              if a.get_attribute("data-state") == "done"], 60, "the regenerated answer")
    requests = browser.execute_script("return window.__requests")
    assert requests[1]["messages"] == requests[0]["messages"] == [{"role": "user", "content": "What is 23 + 45?"}]
    assert len(browser.find_elements("css selector", ".msg.assistant")) == 1
    assert answer_text(again[0]) == first_text
    browser.save_screenshot(str(ARTIFACTS / "browser_chat_regenerate.png"))

    # A second turn, then edit it: the edited question replaces it and gets its own answer.
    second = ask(browser, "And 10 + 5?")
    wait_for(lambda: second.get_attribute("data-state") == "done", 60, "the second answer")
    users = browser.find_elements("css selector", ".msg.user")
    assert not users[0].find_elements("css selector", "button.edit")  # only the last one is editable
    users[1].find_element("css selector", "button.edit").click()
    area = users[1].find_element("css selector", "form.edit textarea")
    area.clear()
    area.send_keys("And 7 + 8?")
    users[1].find_element("css selector", "form.edit button[type=submit]").click()
    wait_for(lambda: len(browser.execute_script("return window.__requests")) == 4, 10, "the edited request")
    wait_for(lambda: browser.find_elements("css selector", ".msg.assistant")[-1].get_attribute("data-state")
             == "done", 60, "the answer to the edited question")
    sent = browser.execute_script("return window.__requests")[3]["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert sent[1]["content"] == first_text and sent[2]["content"] == "And 7 + 8?"
    before = messages_on_page(browser)
    assert [m[0] for m in before] == ["user", "assistant", "user", "assistant"]
    assert before[2][1] == "And 7 + 8?"

    # Reload: the conversation comes back from localStorage, listed under its first question.
    browser.refresh()
    wait_for(lambda: len(browser.find_elements("css selector", "#conversation .msg")) == 4, 10,
             "the conversation to be restored")
    assert messages_on_page(browser) == before
    browser.find_element("css selector", "#history summary").click()
    entries = browser.find_elements("css selector", "#conversation-list li")
    assert [e.find_element("css selector", ".open").text for e in entries] == ["What is 23 + 45?"]
    browser.save_screenshot(str(ARTIFACTS / "browser_chat_reloaded.png"))

    # A new chat, then back to the first one through the list; then delete the first.
    browser.find_element("id", "new-chat").click()
    assert messages_on_page(browser) == []
    answer = ask(browser, "Hello!")
    wait_for(lambda: answer.get_attribute("data-state") == "done", 60, "the new chat's answer")
    titles = [e.text for e in browser.find_elements("css selector", "#conversation-list .open")]
    assert titles == ["Hello!", "What is 23 + 45?"]  # most recent first
    browser.find_elements("css selector", "#conversation-list .open")[1].click()
    assert messages_on_page(browser) == before
    browser.find_elements("css selector", "#conversation-list .delete")[1].click()
    assert messages_on_page(browser) == []  # the open conversation was the deleted one
    assert [c["title"] for c in stored_conversations(browser)] == ["Hello!"]
    browser.refresh()
    wait_for(lambda: "Model:" in browser.find_element("id", "model-status").text, 30, "the page")
    assert [c["title"] for c in stored_conversations(browser)] == ["Hello!"]


def test_long_prompt_shows_a_progress_bar(browser, server):
    """A ~4K-token prompt: the page shows a bar while the server reports prefill progress, and
    removes it once the prompt is read."""
    open_fresh_page(browser, server, max_tokens="4")
    long = " ".join(f"item{i} costs {i % 97} coins;" for i in range(330))  # ~4.2K tokens
    browser.execute_script("document.getElementById('prompt').value = arguments[0]", long)
    before = len(browser.find_elements("css selector", ".msg.assistant"))
    browser.find_element("id", "send").click()
    bar = wait_for(lambda: browser.find_elements("css selector", ".msg.assistant progress.prompt-progress"),
                   60, "the prompt progress bar")[0]
    value, maximum = float(bar.get_attribute("value")), float(bar.get_attribute("max"))
    assert 0 < value < maximum and maximum >= 4096
    browser.execute_script("arguments[0].scrollIntoView({block: 'end'})", bar)
    browser.save_screenshot(str(ARTIFACTS / "browser_chat_progress.png"))
    answer = browser.find_elements("css selector", ".msg.assistant")[before]
    wait_for(lambda: answer.get_attribute("data-state") == "done", 120, "the answer to finish")
    assert not answer.find_elements("css selector", "progress.prompt-progress")

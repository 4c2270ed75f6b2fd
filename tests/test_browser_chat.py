"""The chat page in headless Debian Chromium against a real server: a streamed answer, then
stop during a long generation. Screenshots go to tests/artifacts/.

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
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
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


def test_long_prompt_shows_a_progress_bar(browser, server):
    """A ~4K-token prompt: the page shows a bar while the server reports prefill progress, and
    removes it once the prompt is read."""
    browser.get(server.url + "/")
    wait_for(lambda: "Model:" in browser.find_element("id", "model-status").text, 30,
             "the page to load the model name")
    browser.find_element("css selector", "#settings summary").click()
    set_field(browser, "max-tokens", "4")
    browser.find_element("css selector", "#settings summary").click()
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

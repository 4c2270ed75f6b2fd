// pyengine chat page: streams /v1/chat/completions (SSE over fetch), no build step.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { history: [], controller: null, model: null };

function settings() {
  return {
    system: $("system-prompt").value.trim(),
    temperature: Number($("temperature").value),
    maxTokens: parseInt($("max-tokens").value, 10),
    thinking: $("thinking").checked,
    apiKey: $("api-key").value.trim(),
  };
}

function headers(apiKey) {
  const h = { "Content-Type": "application/json" };
  if (apiKey) h.Authorization = "Bearer " + apiKey;
  return h;
}

async function loadModel() {
  try {
    const resp = await fetch("/v1/models", { headers: headers(settings().apiKey) });
    const body = await resp.json();
    if (!resp.ok) throw new Error(body.error ? body.error.message : resp.statusText);
    state.model = body.data[0].id;
    $("model-status").textContent = "Model: " + state.model;
  } catch (err) {
    $("model-status").textContent = "Not ready: " + err.message;
  }
}

function addMessage(role, text) {
  const el = document.createElement("article");
  el.className = "msg " + role;
  const who = document.createElement("span");
  who.className = "who";
  who.textContent = role === "user" ? "You" : "Assistant";
  el.append(who);
  const body = document.createElement("div");
  body.className = "content";
  body.textContent = text;
  el.append(body);
  $("conversation").append(el);
  el.scrollIntoView({ block: "end" });
  return el;
}

// Text nodes grow with appendData: re-setting textContent per chunk is quadratic.
function reasoningText(answer) {
  let box = answer.querySelector(".reasoning");
  if (!box) {
    box = document.createElement("details");
    box.className = "reasoning";
    box.open = true;
    const summary = document.createElement("summary");
    summary.textContent = "Thinking";
    const text = document.createElement("div");
    text.className = "reasoning-text";
    text.append(document.createTextNode(""));
    box.append(summary, text);
    answer.insertBefore(box, answer.querySelector(".content"));
  }
  return box.querySelector(".reasoning-text").firstChild;
}

// Streamed text reaches the DOM once per animation frame, not once per chunk: at hundreds of
// tokens/s per-chunk updates (and the layout each scroll forces) would swamp the page.
class AnswerView {
  constructor(answer) {
    this.answer = answer;
    this.pending = { reasoning: "", content: "" };
    this.contentText = answer.querySelector(".content").appendChild(document.createTextNode(""));
    this.scheduled = false;
  }

  add(part, text) {
    this.pending[part] += text;
    if (!this.scheduled) {
      this.scheduled = true;
      requestAnimationFrame(() => this.flush());
    }
  }

  flush() {
    this.scheduled = false;
    if (this.pending.reasoning) reasoningText(this.answer).appendData(this.pending.reasoning);
    if (this.pending.content) this.contentText.appendData(this.pending.content);
    if (this.pending.reasoning || this.pending.content) this.answer.scrollIntoView({ block: "end" });
    this.pending = { reasoning: "", content: "" };
  }
}

function showStats(answer, t) {
  const stats = document.createElement("span");
  stats.className = "stats";
  const ttft = t.first ? ((t.first - t.start) / 1000).toFixed(2) + " s" : "–";
  const span = t.first && t.last > t.first ? (t.last - t.first) / 1000 : 0;
  const tps = span > 0 && t.tokens > 1 ? ((t.tokens - 1) / span).toFixed(1) : "–";
  // Without the final usage chunk (stopped answers) the count is of chunks, a lower bound.
  const count = t.exact ? `${t.tokens}` : `≥${t.tokens}`;
  stats.textContent = `${count} tokens · ${tps} tokens/s · first token after ${ttft}`;
  answer.append(stats);
}

// Prefill progress of a long prompt (the server's prompt_progress chunks, asked for with
// return_progress): a bar in the answer while the prompt is read, gone once it is read.
function showPromptProgress(answer, p) {
  let bar = answer.querySelector("progress.prompt-progress");
  if (!p || p.processed >= p.total) {
    if (bar) bar.remove();
    return;
  }
  if (!bar) {
    bar = document.createElement("progress");
    bar.className = "prompt-progress";
    bar.setAttribute("aria-label", "Reading the prompt");
    answer.insertBefore(bar, answer.querySelector(".content"));
  }
  bar.max = p.total;
  bar.value = p.processed;
  bar.title = `Reading the prompt: ${p.processed} of ${p.total} tokens (${p.cache} from the cache)`;
}

function setBusy(busy) {
  $("send").disabled = busy;
  $("stop").disabled = !busy;
  $("conversation").setAttribute("aria-busy", busy ? "true" : "false");
}

async function* sseEvents(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      for (const line of block.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") return;
        yield JSON.parse(data);
      }
    }
  }
}

async function send(text) {
  const s = settings();
  state.history.push({ role: "user", content: text });
  addMessage("user", text);
  const answer = addMessage("assistant", "");
  answer.dataset.state = "streaming";
  const content = answer.querySelector(".content");
  const view = new AnswerView(answer);
  const messages = (s.system ? [{ role: "system", content: s.system }] : []).concat(state.history);
  const request = {
    model: state.model || undefined, messages, stream: true,
    stream_options: { include_usage: true },
    temperature: s.temperature, max_tokens: s.maxTokens > 0 ? s.maxTokens : undefined,
    chat_template_kwargs: { enable_thinking: s.thinking },
    return_progress: true,
  };
  const t = { start: performance.now(), first: 0, last: 0, tokens: 0, exact: false };
  state.controller = new AbortController();
  setBusy(true);
  let reply = "";
  try {
    const resp = await fetch("/v1/chat/completions", {
      method: "POST", headers: headers(s.apiKey), body: JSON.stringify(request),
      signal: state.controller.signal,
    });
    if (!resp.ok) {
      const body = await resp.json().catch(() => ({}));
      throw new Error(body.error ? body.error.message : `HTTP ${resp.status}`);
    }
    for await (const chunk of sseEvents(resp)) {
      if (chunk.error) throw new Error(chunk.error.message);
      if (chunk.prompt_progress) showPromptProgress(answer, chunk.prompt_progress);
      if (chunk.usage) {
        t.tokens = chunk.usage.completion_tokens;
        t.exact = true;
      }
      const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
      if (!delta) continue;
      if (delta.reasoning_content || delta.content) {
        t.last = performance.now();
        if (!t.first) t.first = t.last;
        t.tokens += 1;
      }
      if (delta.reasoning_content) view.add("reasoning", delta.reasoning_content);
      if (delta.content) {
        reply += delta.content;
        view.add("content", delta.content);
      }
    }
    view.flush();
    answer.dataset.state = "done";
  } catch (err) {
    view.flush();
    if (err.name === "AbortError") {
      answer.dataset.state = "stopped";
      const note = document.createElement("em");
      note.textContent = " [stopped]";
      content.append(note);
    } else {
      answer.dataset.state = "error";
      const note = document.createElement("p");
      note.className = "error";
      note.setAttribute("role", "alert");
      note.textContent = "Error: " + err.message;
      answer.append(note);
    }
  } finally {
    showPromptProgress(answer, null);
    state.controller = null;
    setBusy(false);
    showStats(answer, t);
    if (reply) state.history.push({ role: "assistant", content: reply });
    else state.history.pop(); // keep user/assistant turns paired
  }
}

function init() {
  for (const id of ["system-prompt", "temperature", "max-tokens", "thinking", "api-key"]) {
    const el = $(id);
    const saved = localStorage.getItem("pyengine." + id);
    if (saved !== null) el.type === "checkbox" ? (el.checked = saved === "1") : (el.value = saved);
    el.addEventListener("change", () => {
      localStorage.setItem("pyengine." + id, el.type === "checkbox" ? (el.checked ? "1" : "0") : el.value);
      if (id === "api-key") loadModel();
    });
  }
  $("composer").addEventListener("submit", (e) => {
    e.preventDefault();
    const text = $("prompt").value.trim();
    if (!text || state.controller) return;
    $("prompt").value = "";
    send(text);
  });
  $("prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("stop").addEventListener("click", () => state.controller && state.controller.abort());
  $("clear").addEventListener("click", () => {
    if (state.controller) state.controller.abort();
    state.history = [];
    $("conversation").replaceChildren();
  });
  loadModel();
}

document.addEventListener("DOMContentLoaded", init);

// pyengine chat page: streams /v1/chat/completions (SSE over fetch), no build step.
// markdown.js renders answers, conversations.js keeps the conversations in localStorage.
"use strict";

import { ConversationStore, renderList } from "./conversations.js";
import { finishCodeBlocks, renderMarkdown } from "./markdown.js";

const $ = (id) => document.getElementById(id);
const store = new ConversationStore();
const state = { controller: null, model: null };

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

// ---- drawing messages ----

function nearBottom() {
  return window.innerHeight + window.scrollY >= document.documentElement.scrollHeight - 80;
}

function reasoningBox(el, open) {
  let box = el.querySelector(".reasoning");
  if (!box) {
    box = document.createElement("details");
    box.className = "reasoning";
    box.open = open;
    const summary = document.createElement("summary");
    summary.textContent = "Thinking";
    const text = document.createElement("div");
    text.className = "reasoning-text";
    text.append(document.createTextNode(""));
    box.append(summary, text);
    el.insertBefore(box, el.querySelector(".content"));
  }
  return box;
}

function addNote(el, msg) {
  if (msg.state === "stopped") {
    const note = document.createElement("em");
    note.textContent = " [stopped]";
    el.querySelector(".content").append(note);
  } else if (msg.state === "error") {
    const note = document.createElement("p");
    note.className = "error";
    note.setAttribute("role", "alert");
    note.textContent = "Error: " + msg.error;
    el.append(note);
  }
  if (msg.stats) {
    const stats = document.createElement("span");
    stats.className = "stats";
    stats.textContent = msg.stats;
    el.append(stats);
  }
}

function messageElement(msg) {
  const el = document.createElement("article");
  el.className = "msg " + msg.role;
  const who = document.createElement("span");
  who.className = "who";
  who.textContent = msg.role === "user" ? "You" : "Assistant";
  const body = document.createElement("div");
  body.className = "content";
  el.append(who, body);
  if (msg.role === "user") {
    body.textContent = msg.content;
    return el;
  }
  body.classList.add("markdown");
  if (msg.reasoning) reasoningBox(el, false).querySelector(".reasoning-text").textContent = msg.reasoning;
  if (msg.toolCalls && msg.toolCalls.length) showToolCalls(el, msg.toolCalls);
  renderMarkdown(body, msg.content);
  finishCodeBlocks(body);
  addNote(el, msg);
  if (msg.state) el.dataset.state = msg.state;
  return el;
}

// OpenAI-style tool calls streamed in delta.tool_calls: shown as name(arguments).
function showToolCalls(el, calls) {
  let box = el.querySelector(".tool-calls");
  if (!box) {
    box = document.createElement("div");
    box.className = "tool-calls";
    el.insertBefore(box, el.querySelector(".content"));
  }
  box.replaceChildren(...calls.map((call) => {
    const line = document.createElement("code");
    line.textContent = `${call.name || "tool"}(${call.arguments || ""})`;
    return line;
  }));
}

function renderConversation() {
  const conv = store.current;
  $("conversation").replaceChildren(...conv.messages.map(messageElement));
  updateActions();
  renderConversationList();
}

// Edit on the last user message, Regenerate on the last answer; none while one streams.
function updateActions() {
  for (const old of document.querySelectorAll("#conversation .actions")) old.remove();
  if (state.controller) return;
  const els = [...$("conversation").children];
  const messages = store.current.messages;
  const lastUser = messages.map((m) => m.role).lastIndexOf("user");
  const lastAnswer = messages.length - 1;
  const add = (index, label, handler) => {
    if (index < 0 || !els[index]) return;
    let bar = els[index].querySelector(".actions");
    if (!bar) {
      bar = document.createElement("div");
      bar.className = "actions";
      els[index].append(bar);
    }
    const button = document.createElement("button");
    button.type = "button";
    button.className = label.toLowerCase();
    button.textContent = label;
    button.addEventListener("click", () => handler(els[index], index));
    bar.append(button);
  };
  add(lastUser, "Edit", editMessage);
  if (messages[lastAnswer] && messages[lastAnswer].role === "assistant") {
    add(lastAnswer, "Regenerate", regenerate);
  }
}

// ---- streaming ----

// Streamed text reaches the DOM once per animation frame, not once per chunk: at hundreds of
// tokens/s per-chunk updates (and the layout each scroll forces) would swamp the page.
class AnswerView {
  constructor(el, msg) {
    this.el = el;
    this.msg = msg;
    this.content = el.querySelector(".content");
    this.pending = { reasoning: "", content: false };
    this.scheduled = false;
    this.collapsed = false;
  }

  add(part, text) {
    if (part === "reasoning") this.pending.reasoning += text;
    else this.pending.content = true;
    if (!this.scheduled) {
      this.scheduled = true;
      requestAnimationFrame(() => this.flush());
    }
  }

  flush() {
    this.scheduled = false;
    const follow = nearBottom();
    if (this.pending.reasoning) {
      // Text nodes grow with appendData: re-setting textContent per chunk is quadratic.
      reasoningBox(this.el, true).querySelector(".reasoning-text").firstChild
        .appendData(this.pending.reasoning);
    }
    if (this.pending.content) {
      renderMarkdown(this.content, this.msg.content);
      const box = this.el.querySelector(".reasoning");
      if (box && !this.collapsed) box.open = false;  // the answer has started: fold the thinking
      this.collapsed = true;
    }
    if (this.msg.toolCalls.length) showToolCalls(this.el, this.msg.toolCalls);
    if (follow && (this.pending.reasoning || this.pending.content)) {
      this.el.scrollIntoView({ block: "end" });
    }
    this.pending = { reasoning: "", content: false };
  }
}

function statsText(t) {
  const ttft = t.first ? ((t.first - t.start) / 1000).toFixed(2) + " s" : "–";
  const span = t.first && t.last > t.first ? (t.last - t.first) / 1000 : 0;
  const tps = span > 0 && t.tokens > 1 ? ((t.tokens - 1) / span).toFixed(1) : "–";
  // Without the final usage chunk (stopped answers) the count is of chunks, a lower bound.
  const count = t.exact ? `${t.tokens}` : `≥${t.tokens}`;
  return `${count} tokens · ${tps} tokens/s · first token after ${ttft}`;
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

function requestMessages(conv, system) {
  // Answers that failed before any text are left out; their question stays for a retry.
  const turns = conv.messages.filter((m) => m.role === "user" || m.content)
    .map((m) => ({ role: m.role, content: m.content }));
  return (system ? [{ role: "system", content: system }] : []).concat(turns);
}

function addToolCallDeltas(calls, deltas) {
  for (const d of deltas) {
    const call = calls[d.index || 0] || (calls[d.index || 0] = { name: "", arguments: "" });
    if (d.function && d.function.name) call.name += d.function.name;
    if (d.function && d.function.arguments) call.arguments += d.function.arguments;
  }
}

/** Streams an answer to the conversation's messages into a new assistant message. */
async function generate(conv) {
  const s = settings();
  const request = {
    model: state.model || undefined, messages: requestMessages(conv, s.system), stream: true,
    stream_options: { include_usage: true },
    temperature: s.temperature, max_tokens: s.maxTokens > 0 ? s.maxTokens : undefined,
    chat_template_kwargs: { enable_thinking: s.thinking },
    return_progress: true,
  };
  const msg = { role: "assistant", content: "", reasoning: "", toolCalls: [], state: "streaming" };
  conv.messages.push(msg);
  const el = messageElement(msg);
  $("conversation").append(el);
  el.scrollIntoView({ block: "end" });
  const view = new AnswerView(el, msg);
  const t = { start: performance.now(), first: 0, last: 0, tokens: 0, exact: false };
  state.controller = new AbortController();
  setBusy(true);
  updateActions();
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
      if (chunk.prompt_progress) showPromptProgress(el, chunk.prompt_progress);
      if (chunk.usage) {
        t.tokens = chunk.usage.completion_tokens;
        t.exact = true;
      }
      const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
      if (!delta) continue;
      if (delta.reasoning_content || delta.content || delta.tool_calls) {
        t.last = performance.now();
        if (!t.first) t.first = t.last;
        t.tokens += 1;
      }
      if (delta.reasoning_content) {
        msg.reasoning += delta.reasoning_content;
        view.add("reasoning", delta.reasoning_content);
      }
      if (delta.content) {
        msg.content += delta.content;
        view.add("content", delta.content);
      }
      if (delta.tool_calls) {
        addToolCallDeltas(msg.toolCalls, delta.tool_calls);
        view.add("content", "");
      }
    }
    msg.state = "done";
  } catch (err) {
    msg.state = err.name === "AbortError" ? "stopped" : "error";
    msg.error = err.message;
  } finally {
    showPromptProgress(el, null);
    view.flush();
    finishCodeBlocks(view.content);
    msg.stats = statsText(t);
    addNote(el, msg);
    el.dataset.state = msg.state;
    state.controller = null;
    setBusy(false);
    store.save(conv);
    if (conv === store.current) renderConversationList();
    updateActions();
  }
}

function renderConversationList() {
  renderList(store, $("conversation-list"), $("history-count"), { onOpen: openConversation,
                                                                  onDelete: deleteConversation });
}

// ---- user actions ----

function sendMessage(text) {
  const conv = store.current;
  conv.messages.push({ role: "user", content: text });
  store.save(conv);
  const el = messageElement(conv.messages[conv.messages.length - 1]);
  $("conversation").append(el);
  renderConversationList();
  return generate(conv);
}

function regenerate() {
  const conv = store.current;
  if (state.controller || !conv.messages.length) return;
  if (conv.messages[conv.messages.length - 1].role === "assistant") {
    conv.messages.pop();
    $("conversation").lastElementChild.remove();
  }
  generate(conv);
}

// The last user message becomes a text box; sending it replaces that turn and its answer.
function editMessage(el, index) {
  if (state.controller) return;
  const msg = store.current.messages[index];
  const form = document.createElement("form");
  form.className = "edit";
  const area = document.createElement("textarea");
  area.value = msg.content;
  area.rows = Math.min(10, msg.content.split("\n").length + 1);
  area.setAttribute("aria-label", "Edit your message");
  const save = document.createElement("button");
  save.type = "submit";
  save.textContent = "Send";
  const cancel = document.createElement("button");
  cancel.type = "button";
  cancel.className = "secondary";
  cancel.textContent = "Cancel";
  cancel.addEventListener("click", renderConversation);
  form.append(area, save, cancel);
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const text = area.value.trim();
    if (!text || state.controller) return;
    const conv = store.current;
    conv.messages.splice(index);
    renderConversation();
    sendMessage(text);
  });
  el.querySelector(".content").replaceWith(form);
  el.querySelector(".actions")?.remove();
  area.focus();
}

function openConversation(id) {
  if (state.controller) state.controller.abort();
  store.open(id);
  renderConversation();
}

function deleteConversation(id) {
  if (state.controller && store.current.id === id) state.controller.abort();
  store.remove(id);
  renderConversation();
}

function newConversation() {
  if (state.controller) state.controller.abort();
  store.startNew();
  renderConversation();
  $("prompt").focus();
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
    sendMessage(text);
  });
  $("prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("stop").addEventListener("click", () => state.controller && state.controller.abort());
  $("new-chat").addEventListener("click", newConversation);
  renderConversation();
  loadModel();
}

init();  // a module runs after the document is parsed

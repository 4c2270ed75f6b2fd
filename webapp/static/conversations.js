// Conversations kept in the browser (localStorage): the list, the open one, and the panel that
// switches between them and deletes them. Nothing of it reaches the server except as the
// messages of the next request.
"use strict";

const LIST_KEY = "pyengine.conversations";
const CURRENT_KEY = "pyengine.current";
const TITLE_CHARS = 60;

function newId() {
  return Date.now().toString(36) + Math.random().toString(36).slice(2, 8);
}

function loadList() {
  try {
    const list = JSON.parse(localStorage.getItem(LIST_KEY) || "[]");
    if (!Array.isArray(list)) return [];
    const kept = list.filter((c) => c && c.id && Array.isArray(c.messages));
    for (const m of kept.flatMap((c) => c.messages)) {
      if (m.state === "streaming") m.state = "stopped";  // the page was left mid-answer
    }
    return kept;
  } catch {
    return [];  // a damaged entry must not keep the page from starting
  }
}

export class ConversationStore {
  constructor() {
    this.list = loadList();  // most recently updated first
    const current = localStorage.getItem(CURRENT_KEY);
    this.current = this.list.find((c) => c.id === current) || this.blank();
  }

  blank() {
    return { id: newId(), title: "", updated: Date.now(), messages: [] };
  }

  /** Starts an empty conversation; it is listed once it has a message. */
  startNew() {
    this.current = this.blank();
    localStorage.removeItem(CURRENT_KEY);
    return this.current;
  }

  open(id) {
    const found = this.list.find((c) => c.id === id);
    if (found) {
      this.current = found;
      localStorage.setItem(CURRENT_KEY, id);
    }
    return this.current;
  }

  /** Stores a conversation after a change (a message added, an answer finished). */
  save(conv) {
    conv.updated = Date.now();
    const first = conv.messages.find((m) => m.role === "user");
    if (first) {
      const text = first.content.replace(/\s+/g, " ").trim();
      conv.title = text.length > TITLE_CHARS ? text.slice(0, TITLE_CHARS - 1) + "…" : text;
    }
    this.list = [conv, ...this.list.filter((c) => c.id !== conv.id)];
    if (conv === this.current) localStorage.setItem(CURRENT_KEY, conv.id);
    this.persist();
  }

  remove(id) {
    this.list = this.list.filter((c) => c.id !== id);
    if (this.current.id === id) this.startNew();
    this.persist();
  }

  // Out of space (localStorage holds a few MB): the oldest conversations go first.
  persist() {
    for (;;) {
      try {
        localStorage.setItem(LIST_KEY, JSON.stringify(this.list));
        return;
      } catch (err) {
        const oldest = this.list.length > 1 ? this.list[this.list.length - 1] : null;
        if (!oldest || oldest === this.current) throw err;
        this.list.pop();
      }
    }
  }
}

/** Redraws the conversation list; onOpen(id) and onDelete(id) handle the clicks. */
export function renderList(store, listEl, countEl, { onOpen, onDelete }) {
  const items = store.list.map((conv) => {
    const li = document.createElement("li");
    const open = document.createElement("button");
    open.type = "button";
    open.className = "open";
    open.textContent = conv.title || "(untitled)";
    open.title = new Date(conv.updated).toLocaleString();
    if (conv.id === store.current.id) open.setAttribute("aria-current", "true");
    open.addEventListener("click", () => onOpen(conv.id));
    const del = document.createElement("button");
    del.type = "button";
    del.className = "delete";
    del.textContent = "✕";
    del.title = "Delete";
    del.setAttribute("aria-label", `Delete conversation: ${open.textContent}`);
    del.addEventListener("click", () => onDelete(conv.id));
    li.dataset.id = conv.id;
    li.append(open, del);
    return li;
  });
  listEl.replaceChildren(...items);
  countEl.textContent = items.length ? `(${items.length})` : "";
}

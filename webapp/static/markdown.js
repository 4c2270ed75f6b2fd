// Model output -> safe HTML. marked parses the markdown, DOMPurify removes anything that could run
// (scripts, event handlers, javascript: links), highlight.js colours the finished code blocks.
// The three libraries are vendored in static/vendor/ (tools/webapp_vendor.sh) and loaded by
// index.html as globals before this module.
"use strict";

const { marked, DOMPurify, hljs } = window;

const escapeHtml = (text) => text.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);

// breaks: a single newline is a line break; models write step-by-step lines that way.
// Design decision: answers never load images. An image URL that a model writes (perhaps steered
// by text it was asked to read) would send data to that host the moment the answer renders, so
// a markdown image becomes a link and HTML <img> is removed by the sanitizer.
const parser = new marked.Marked({
  gfm: true,
  breaks: true,
  renderer: {
    image({ href, text }) {
      return `<a href="${escapeHtml(href || "")}">${escapeHtml(text || href || "image")}</a>`;
    },
  },
});

// Links from the model open in a new tab and cannot reach back into this page.
DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A" && node.hasAttribute("href")) {
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer");
  }
});

const PURIFY = { FORBID_TAGS: ["img", "style", "form", "input", "button", "textarea", "select"],
                 FORBID_ATTR: ["style"] };

/** Replaces el's children with the rendered, sanitized markdown of text. */
export function renderMarkdown(el, text) {
  el.innerHTML = DOMPurify.sanitize(parser.parse(text), PURIFY);
}

/** Copies text to the clipboard; the fallback serves pages that are not a secure context
 * (the server reached over plain http from another machine), where navigator.clipboard is absent. */
export async function copyText(text) {
  if (navigator.clipboard && window.isSecureContext) {
    await navigator.clipboard.writeText(text);
    return;
  }
  const area = document.createElement("textarea");
  area.value = text;
  area.setAttribute("readonly", "");
  area.style.position = "fixed";
  area.style.opacity = "0";
  document.body.append(area);
  area.select();
  const ok = document.execCommand("copy");
  area.remove();
  if (!ok) throw new Error("the browser refused to copy");
}

function languageOf(code) {
  const match = /(?:^|\s)language-([\w+#.-]+)/.exec(code.className);
  return match ? match[1] : "";
}

function highlight(code) {
  const lang = languageOf(code);
  if (lang && !hljs.getLanguage(lang)) {
    code.classList.remove(`language-${lang}`);  // unknown to the bundle: let it guess
  }
  hljs.highlightElement(code);
}

/** Highlights the code blocks under el and gives each a header with its language and a Copy
 * button. Run once an answer is complete: while it streams the blocks are re-rendered each frame. */
export function finishCodeBlocks(el) {
  for (const code of el.querySelectorAll("pre > code")) {
    const pre = code.parentElement;
    if (pre.parentElement.classList.contains("code-block")) continue;
    const lang = languageOf(code);
    highlight(code);
    const block = document.createElement("div");
    block.className = "code-block";
    const head = document.createElement("div");
    head.className = "code-head";
    const label = document.createElement("span");
    label.className = "code-lang";
    label.textContent = lang || "code";
    const copy = document.createElement("button");
    copy.type = "button";
    copy.className = "copy";
    copy.textContent = "Copy";
    copy.setAttribute("aria-label", `Copy ${lang || "code"} to the clipboard`);
    copy.addEventListener("click", async () => {
      try {
        await copyText(code.textContent.replace(/\n$/, ""));  // marked ends blocks with a newline
        copy.textContent = "Copied";
      } catch (err) {
        copy.textContent = "Copy failed";
        copy.title = err.message;
      }
      setTimeout(() => { copy.textContent = "Copy"; }, 1500);
    });
    head.append(label, copy);
    pre.replaceWith(block);
    block.append(head, pre);
  }
}

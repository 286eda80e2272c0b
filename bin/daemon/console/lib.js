// What every page of the console uses (docs/console.md): building
// elements, talking to the API, and the model's markdown made safe.
//
// Everything a model, a tool or a user wrote goes on the page as text
// (textContent), with one exception: a model's answer is markdown, turned
// into elements by the vendored markdown-it with raw HTML off (markup in
// the answer stays text) and then filtered to a short list of harmless
// elements and attributes (`markdownInto`).

export const main = document.getElementById("main");

/** What the current page holds open (event streams), closed on leaving. */
export const leaving = [];

/** An element with attributes and children; strings become text nodes. */
export function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else if (name === "class") node.className = value;
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(typeof child === "string" || typeof child === "number" ? String(child) : child);
  }
  return node;
}

export function show(...nodes) {
  main.replaceChildren(...nodes);
}

export function ago(ms) {
  if (!ms) return "";
  const seconds = Math.max(0, Math.round((Date.now() - ms) / 1000));
  if (seconds < 60) return `${seconds} s ago`;
  if (seconds < 3600) return `${Math.round(seconds / 60)} min ago`;
  if (seconds < 86400) return `${Math.round(seconds / 3600)} h ago`;
  return `${Math.round(seconds / 86400)} d ago`;
}

export function stateBadge(state) {
  return el("span", { class: `state ${state}`, "data-state": state }, state);
}

export const conversationPath = (id) => `/v1/conversations/${encodeURIComponent(id)}`;

/** Where the daemon serves one of a conversation's stored images. */
export const imageUrl = (id, hash) => `${conversationPath(id)}/images/${encodeURIComponent(hash)}`;

export class SignInNeeded extends Error {}

/** A request to the daemon's API; its JSON answer, or an Error with the API's message. */
export async function api(method, path, body) {
  const headers = { "X-Keel-Console": "1" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, {
    method,
    headers,
    credentials: "same-origin",
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (response.status === 401) throw new SignInNeeded();
  const text = await response.text();
  let json = null;
  try { json = text ? JSON.parse(text) : null; } catch (_) { json = null; }
  if (!response.ok) {
    const message = json && json.error ? `${json.error.code}: ${json.error.message}` : `${response.status} ${text}`;
    throw new Error(message);
  }
  return json;
}

export function errorBox(error) {
  return el("div", { class: "error-box", role: "alert" }, String(error.message || error));
}

/** Runs `work`; a refused sign-in goes to the sign-in page, any other error is shown. */
export async function guarded(work, where) {
  try {
    await work();
  } catch (error) {
    if (error instanceof SignInNeeded) {
      location.hash = "#/sign-in";
      return;
    }
    (where || main).prepend(errorBox(error));
  }
}

// --- markdown --------------------------------------------------------------

// Raw HTML off: `<img src=x onerror=…>` in an answer is text. No images
// either: a model's answer loads nothing. Links open apart, without the
// console as their referrer or opener.
const markdown = window.markdownit({ html: false, linkify: true });
markdown.disable(["image"]);

// What a rendering may hold: markdown-it's elements for text, lists,
// code, quotes, tables and links, and no attribute but these.
const ALLOWED = new Set([
  "P", "EM", "STRONG", "CODE", "PRE", "UL", "OL", "LI", "A", "H1", "H2", "H3", "H4", "H5", "H6",
  "BLOCKQUOTE", "HR", "BR", "TABLE", "THEAD", "TBODY", "TR", "TH", "TD", "S", "DEL",
]);
const SAFE_LINK = /^(https?:|mailto:)/i;

/** Fills `node` with `text` as markdown, keeping only harmless elements. */
export function markdownInto(node, text) {
  const template = document.createElement("template");
  template.innerHTML = markdown.render(text);
  clean(template.content);
  node.replaceChildren(template.content);
}

function clean(parent) {
  for (const child of Array.from(parent.childNodes)) {
    if (child.nodeType === Node.TEXT_NODE) continue;
    if (child.nodeType !== Node.ELEMENT_NODE || !ALLOWED.has(child.tagName)) {
      // Whatever else there is becomes its text.
      child.replaceWith(document.createTextNode(child.textContent || ""));
      continue;
    }
    for (const attribute of Array.from(child.attributes)) {
      const keep = (child.tagName === "A" && attribute.name === "href" && SAFE_LINK.test(attribute.value))
        || (child.tagName === "OL" && attribute.name === "start")
        || (child.tagName === "CODE" && attribute.name === "class" && /^language-[\w-]+$/.test(attribute.value));
      if (!keep) child.removeAttribute(attribute.name);
    }
    if (child.tagName === "A") {
      child.setAttribute("target", "_blank");
      child.setAttribute("rel", "noopener noreferrer");
    }
    clean(child);
  }
}

// DOM helpers. Every text reaches the page through text nodes or attributes, never
// innerHTML: runs' commands, outputs and UI blocks are untrusted.

/**
 * h("div", {class: "x", onclick: fn, dataset: {...}}, child, ...): an element. Children
 * are nodes, strings (text nodes), arrays of those, or null/false (skipped).
 */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  setAttrs(el, attrs);
  append(el, children);
  return el;
}

const SVG = "http://www.w3.org/2000/svg";

/** An SVG element, as `h`. */
export function s(tag, attrs, ...children) {
  const el = document.createElementNS(SVG, tag);
  setAttrs(el, attrs);
  append(el, children);
  return el;
}

function setAttrs(el, attrs) {
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") el.addEventListener(key.slice(2), value);
    else if (key === "dataset") Object.assign(el.dataset, value);
    else if (key === "style") Object.assign(el.style, value);
    else if (key === "value" && "value" in el) el.value = value;
    else if (key === "checked") el.checked = !!value;
    else el.setAttribute(key, value === true ? "" : String(value));
  }
}

export function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

export function clear(el) {
  while (el.firstChild) el.removeChild(el.firstChild);
  return el;
}

export function fmtCost(usd) {
  if (!usd) return "$0";
  if (usd < 0.01) return "$" + usd.toFixed(4);
  return "$" + usd.toFixed(usd < 100 ? 2 : 0);
}

export function fmtInt(n) {
  return (n || 0).toLocaleString("en-US");
}

export function fmtDuration(ms) {
  if (ms === undefined || ms === null) return "";
  if (ms < 1000) return `${Math.round(ms)} ms`;
  const secs = ms / 1000;
  if (secs < 60) return `${secs.toFixed(secs < 10 ? 2 : 1)} s`;
  const mins = Math.floor(secs / 60);
  if (mins < 60) return `${mins}m ${Math.round(secs % 60)}s`;
  return `${Math.floor(mins / 60)}h ${mins % 60}m`;
}

export function fmtAge(ms, now = Date.now()) {
  const secs = Math.max(0, Math.round((now - ms) / 1000));
  if (secs < 60) return `${secs}s ago`;
  if (secs < 3600) return `${Math.floor(secs / 60)}m ago`;
  if (secs < 86400) return `${Math.floor(secs / 3600)}h ago`;
  return `${Math.floor(secs / 86400)}d ago`;
}

export function fmtTime(ms) {
  return new Date(ms).toLocaleString();
}

export function stateBadge(run) {
  const text = run.wait_reason ? `${run.state} (${run.wait_reason})` : run.state;
  return h("span", { class: `badge s-${run.state}`, "data-state": run.state }, text);
}

export function json(value) {
  return h("pre", {}, JSON.stringify(value, null, 2));
}

/** A short-lived message at the corner of the page. */
export function toast(message, bad = false) {
  const box = document.getElementById("toast");
  const item = h("div", { class: bad ? "bad" : "" }, message);
  box.append(item);
  setTimeout(() => item.remove(), bad ? 8000 : 3500);
}

/** Calls `fn` at most once per `ms`, after the last call (trailing). */
export function debounce(fn, ms) {
  let timer = null;
  return (...args) => {
    clearTimeout(timer);
    timer = setTimeout(() => fn(...args), ms);
  };
}

/** Replaces `el`'s children with `children` (nodes, strings, arrays of those). */
export function fill(el, ...children) {
  clear(el);
  return append(el, children);
}

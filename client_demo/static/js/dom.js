// Tiny DOM helpers. Every piece of text goes through textContent / createTextNode:
// nothing in this client ever assigns innerHTML, so model, tool and user text cannot
// inject markup.

/**
 * h("div", {class: "x", dataset: {testid: "y"}, onclick: fn}, "text", child, [more])
 * Attributes starting with "on" become event listeners; `dataset` fills data-* attributes;
 * `text` sets textContent; booleans toggle boolean attributes; null/undefined are skipped.
 */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "dataset") {
      for (const [k, v] of Object.entries(value)) {
        if (v !== null && v !== undefined) el.dataset[k] = String(v);
      }
    } else if (key === "text") {
      el.textContent = String(value);
    } else if (key.startsWith("on") && typeof value === "function") {
      el.addEventListener(key.slice(2).toLowerCase(), value);
    } else if (key === "class") {
      el.className = value;
    } else if (value === true) {
      el.setAttribute(key, "");
    } else {
      el.setAttribute(key, String(value));
    }
  }
  append(el, children);
  return el;
}

export function append(parent, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    parent.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return parent;
}

export function clear(el) {
  while (el.firstChild) el.removeChild(el.firstChild);
  return el;
}

export function $(selector, root = document) {
  return root.querySelector(selector);
}

/** Set textContent only when it changed (keeps selections and avoids layout work). */
export function setText(el, text) {
  const value = text === null || text === undefined ? "" : String(text);
  if (el.textContent !== value) el.textContent = value;
}

export function show(el, visible) {
  el.hidden = !visible;
}

const timeFormat = new Intl.DateTimeFormat(undefined, { hour: "2-digit", minute: "2-digit", second: "2-digit" });
const dateTimeFormat = new Intl.DateTimeFormat(undefined, {
  month: "short",
  day: "numeric",
  hour: "2-digit",
  minute: "2-digit",
});

/** A <time> element for an ISO timestamp, shown as local time. */
export function timeEl(iso, { withDate = false } = {}) {
  const el = h("time");
  setTime(el, iso, { withDate });
  return el;
}

export function setTime(el, iso, { withDate = false } = {}) {
  if (!iso) {
    setText(el, "");
    return;
  }
  const date = new Date(iso);
  if (Number.isNaN(date.getTime())) {
    setText(el, String(iso));
    return;
  }
  el.setAttribute("datetime", date.toISOString());
  el.title = date.toLocaleString();
  setText(el, withDate ? dateTimeFormat.format(date) : timeFormat.format(date));
}

/** "just now", "5 min ago", "3 h ago", else a short date. */
export function relativeTime(iso, now = Date.now()) {
  const t = new Date(iso).getTime();
  if (Number.isNaN(t)) return "";
  const s = Math.max(0, Math.round((now - t) / 1000));
  if (s < 45) return "just now";
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${Math.round(s / 3600)} h ago`;
  return dateTimeFormat.format(new Date(t));
}

/** Pretty JSON for display (as text, never markup). */
export function prettyJson(value) {
  try {
    return JSON.stringify(value, null, 2);
  } catch {
    return String(value);
  }
}

/** One-line `key: value, ...` summary of a tool's arguments. */
export function argsSummary(args, max = 80) {
  let text;
  if (typeof args === "string") {
    text = args.replace(/\s+/g, " ").trim();
  } else if (args && typeof args === "object" && !Array.isArray(args)) {
    text = Object.entries(args)
      .map(([k, v]) => `${k}: ${typeof v === "string" ? v : JSON.stringify(v)}`)
      .join(", ");
  } else {
    text = JSON.stringify(args);
  }
  text = text || "no arguments";
  return text.length > max ? `${text.slice(0, max - 1)}…` : text;
}

const SVG_NS = "http://www.w3.org/2000/svg";
// Stroke icons (24x24 viewBox), drawn as SVG so no icon font or emoji font is needed.
const ICONS = {
  plus: ["M12 5v14", "M5 12h14"],
  tool: [
    "M14.7 6.3a1 1 0 0 0 0 1.4l1.6 1.6a1 1 0 0 0 1.4 0l3.77-3.77a6 6 0 0 1-7.94 7.94l-6.91 6.91a2.12 2.12 0 0 1-3-3l6.91-6.91a6 6 0 0 1 7.94-7.94l-3.76 3.76z",
  ],
  shield: ["M12 22s8-4 8-10V5l-8-3-8 3v7c0 6 8 10 8 10z", "M12 8v4", "M12 16h.01"],
  check: ["M20 6 9 17l-5-5"],
  x: ["M18 6 6 18", "M6 6l12 12"],
};

/** An inline SVG icon by name (decorative: aria-hidden). */
export function icon(name, cls = "icon") {
  const svg = document.createElementNS(SVG_NS, "svg");
  svg.setAttribute("viewBox", "0 0 24 24");
  svg.setAttribute("class", cls);
  svg.setAttribute("aria-hidden", "true");
  svg.setAttribute("fill", "none");
  svg.setAttribute("stroke", "currentColor");
  svg.setAttribute("stroke-width", "2");
  svg.setAttribute("stroke-linecap", "round");
  svg.setAttribute("stroke-linejoin", "round");
  for (const d of ICONS[name] || []) {
    const path = document.createElementNS(SVG_NS, "path");
    path.setAttribute("d", d);
    svg.append(path);
  }
  return svg;
}

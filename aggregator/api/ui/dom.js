// DOM building without HTML strings: every value becomes a text node or an attribute
// set with setAttribute, so nothing the API sends is ever parsed as markup.

const SVG_NS = "http://www.w3.org/2000/svg";

/** h("td", {class: "ok", title: x}, "text", childNode, [more]) -> HTMLElement */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  setAttrs(el, attrs);
  append(el, children);
  return el;
}

function setAttrs(el, attrs) {
  for (const [key, value] of Object.entries(attrs ?? {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on")) {
      if (typeof value === "function") el.addEventListener(key.slice(2), value);
    } else {
      el.setAttribute(key, value === true ? "" : String(value));
    }
  }
}

export function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

export function replace(el, ...children) {
  el.replaceChildren();
  return append(el, children);
}

/** A link inside the page; the target is built from encoded parts only. */
export function link(parts, ...children) {
  const href = "#/" + parts.map((p) => encodeURIComponent(String(p))).join("/");
  return h("a", { href }, ...children);
}

/** A link to one resource's trace: `#/trace/NODE/RESOURCE`, the resource's '/' kept as
 * is (`#/trace/node-a/rdma/ib`), so the address reads the way people type it. */
export function traceLink(node, resource, ...children) {
  return link(["trace", node, ...String(resource).split("/")], ...children);
}

// Where text may wrap. Chromium breaks after any hyphen, so "port-down" or "gpu-ib-01"
// split mid-word in a narrow column; names instead break only after '.', '_', '/', ':' or
// ',' (NATS subjects, PCI addresses, device, module and resource names) and at spaces. A
// run longer than LONG with none of those (a srcversion hash) may break anywhere.
const BREAK_AFTER = /(?<=[._/:,])(?=[^._/:,])/;
const LONG = 24;

function pieces(text, makeRun, shortest = 0) {
  const out = [];
  for (const word of String(text ?? "").split(/(\s+)/)) {
    if (word === "" || /^\s+$/.test(word)) {
      if (word) out.push(word);
      continue;
    }
    (word.length > shortest ? word.split(BREAK_AFTER) : [word]).forEach((run, index) => {
      if (index > 0) out.push(document.createElement("wbr"));
      out.push(makeRun(run));
    });
  }
  return out;
}

/** A name or subject: never wraps at a hyphen, only at the points above, and only when
 * longer than a device or port name ("mlx5_1/1" and "0000:cb:00.0" stay whole). */
export function token(text) {
  return h("span", { class: "name" },
    pieces(text, (run) => h("span", { class: run.length > LONG ? "run long" : "run" }, run), 12));
}

/** A sentence: wraps at spaces as usual, and inside the long names it mentions (a
 * short one like "22.38.1002" moves to the next line whole). */
export function prose(text) {
  return h("span", { class: "prose" },
    pieces(text, (run) => (run.length > LONG ? h("span", { class: "long" }, run) : run), 16));
}

/**
 * Mark the items of a wrapping flex list that start a row (`data-row-start`), so the
 * arrow drawn before each item shows only between neighbours on one row: CSS cannot
 * tell where a flex line wrapped. Call it after layout and on resize.
 */
export function markRowStarts(list) {
  let top = null;
  for (const item of list.children) {
    const starts = top === null || item.offsetTop > top + 1;
    if (starts) top = item.offsetTop;
    item.toggleAttribute("data-row-start", starts);
  }
}

/** Inline SVG polyline of `values` (numbers), scaled to its own maximum. */
export function sparkline(values, { width = 120, height = 22, label = "", series = "" } = {}) {
  const svg = document.createElementNS(SVG_NS, "svg");
  svg.setAttribute("class", "spark");
  svg.setAttribute("width", String(width));
  svg.setAttribute("height", String(height));
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", label);
  const numbers = values.map(Number).filter(Number.isFinite);
  svg.dataset.series = series;
  svg.dataset.points = String(numbers.length);
  svg.dataset.max = String(Math.max(0, ...numbers));
  if (numbers.length < 2) return svg;
  const max = Math.max(...numbers) || 1;
  const step = width / (numbers.length - 1);
  const points = numbers.map((v, i) => {
    const y = height - 1 - (Math.max(v, 0) / max) * (height - 2);
    return `${(i * step).toFixed(1)},${y.toFixed(1)}`;
  });
  const line = document.createElementNS(SVG_NS, "polyline");
  line.setAttribute("points", points.join(" "));
  svg.append(line);
  return svg;
}

/** A table in a box that scrolls sideways, so it can never push out of its card. */
export function table(headers, rows, attrs = {}) {
  return h("div", { class: "table-box" }, h(
    "table",
    { class: "grid", ...attrs },
    h("thead", {}, h("tr", {}, headers.map((x) => h("th", {}, x)))),
    h("tbody", {}, rows),
  ));
}

export function fmtRate(bytesPerSecond) {
  const v = Number(bytesPerSecond);
  if (!Number.isFinite(v)) return "–";
  const units = ["B/s", "kB/s", "MB/s", "GB/s", "TB/s"];
  let value = v;
  let unit = 0;
  while (Math.abs(value) >= 1000 && unit < units.length - 1) {
    value /= 1000;
    unit += 1;
  }
  return `${value.toFixed(value < 10 && unit > 0 ? 1 : 0)} ${units[unit]}`;
}

export function fmtAge(seconds) {
  const v = Number(seconds);
  if (!Number.isFinite(v)) return "–";
  if (v < 60) return `${v.toFixed(v < 10 ? 1 : 0)} s`;
  if (v < 3600) return `${Math.floor(v / 60)} min`;
  if (v < 86400) return `${Math.floor(v / 3600)} h`;
  return `${Math.floor(v / 86400)} d`;
}

export function fmtTime(unixSeconds) {
  const v = Number(unixSeconds);
  if (!Number.isFinite(v) || v <= 0) return "–";
  return new Date(v * 1000).toISOString().replace("T", " ").slice(0, 19) + "Z";
}

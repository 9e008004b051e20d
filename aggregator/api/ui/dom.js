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

export function table(headers, rows, attrs = {}) {
  return h(
    "table",
    { class: "grid", ...attrs },
    h("thead", {}, h("tr", {}, headers.map((x) => h("th", {}, x)))),
    h("tbody", {}, rows),
  );
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

// nicfleet status page: hash routes (#/, #/node/NAME, #/trace/NODE/RESOURCE) re-polled
// on a timer, the live alerts panel fed by the SSE stream (filtered by words and
// severity, skew alerts grouped), and the token prompt that any 401 opens. Plain ES
// modules, no framework, no build step.

import { ApiError, AuthRequired, followAlerts, getToken, getJSON, setToken } from "./api.js";
import { fmtAge, h, link, markRowStarts, prose, replace, token, traceLink } from "./dom.js";
import { loadFleet, loadNode, loadTrace } from "./views.js";

const REFRESH_MS = { fleet: 5000, node: 2000, trace: 5000 };
const SEVERITY_RANK = { critical: 0, warning: 1, info: 2 };
const MAX_ALERT_ROWS = 200;
const SEVERITIES = ["critical", "warning", "info"];
// fw-skew, driver-skew, clock-skew: one fleet-wide story told on many nodes, so one group
// per rule (and severity, state), whether the rule raises one alert per adapter or one
// per version set.
const GROUPED = /-skew$/;

const $ = (selector) => document.querySelector(selector);
const view = $("#view");
const alerts = new Map(); // fingerprint -> Alert
const filter = { words: [], severities: new Set(SEVERITIES), resolved: true };
const expanded = new Set(); // keys of the alert groups the user opened
let generation = 0;
let timer = null;
let stream = null; // AbortController of the running alert stream

function decode(part) {
  try {
    return decodeURIComponent(part);
  } catch {
    return part; // a stray '%' typed by hand: take it literally
  }
}

/** `#/trace/NODE/RESOURCE` takes the resource as typed (`rdma/ib`) or encoded (`rdma%2Fib`). */
function parseRoute() {
  const parts = window.location.hash.replace(/^#\/?/, "").replace(/\/+$/, "").split("/").map(decode);
  if (parts[0] === "node" && parts.length === 2 && parts[1]) return { name: "node", node: parts[1] };
  if (parts[0] === "trace" && parts.length >= 3 && parts[1]) {
    return { name: "trace", node: parts[1], resource: parts.slice(2).join("/") };
  }
  return { name: "fleet" };
}

function load(route) {
  if (route.name === "node") return loadNode(route.node);
  if (route.name === "trace") return loadTrace(route.node, route.resource);
  return loadFleet();
}

function crumbs(route) {
  const trail = [link([""], "fleet")];
  if (route.node) trail.push(" / ", link(["node", route.node], token(route.node)));
  if (route.resource) trail.push(" / ", token(route.resource));
  replace($("#crumbs"), trail);
}

async function render() {
  const mine = ++generation;
  clearTimeout(timer);
  const route = parseRoute();
  crumbs(route);
  try {
    const tree = await load(route);
    if (mine !== generation) return;
    const open = new Set([...view.querySelectorAll("[data-link] details[open]")].map((d) => d.parentElement.dataset.link));
    replace(view, tree);
    for (const item of view.querySelectorAll("[data-link]")) {
      if (open.has(item.dataset.link)) item.querySelector("details").open = true;
    }
    view.dataset.view = route.name;
    markChain();
    drawAlerts(); // keeps the "since" column current
  } catch (error) {
    if (mine !== generation) return;
    if (error instanceof AuthRequired) {
      replace(view, h("p", { class: "muted" }, "This aggregator needs an API token."));
      askToken(error.message);
      return; // submitting the token renders again
    }
    replace(view, problem(error));
    view.dataset.view = "error";
  }
  timer = setTimeout(() => mine === generation && render(), REFRESH_MS[route.name]);
}

function problem(error) {
  if (!(error instanceof ApiError)) {
    return h("p", { class: "bad", id: "problem" }, `Cannot reach the aggregator: ${error.message}`);
  }
  const route = parseRoute();
  return h("div", { id: "problem" },
    h("p", { class: "bad" }, `${error.status}: ${error.message}`),
    error.suggestions.length
      ? h("p", {}, "Did you mean ", error.suggestions.map((s) =>
        [route.name === "trace" && route.node !== s ? traceLink(route.node, s, token(s)) : link(["node", s], token(s)), " "]))
      : null);
}

// --- live alerts -------------------------------------------------------------------

function setLive(state, text) {
  const live = $("#live");
  live.dataset.state = state;
  live.textContent = `alerts: ${text ?? state}`;
}

const COLUMNS = 5; // severity (and state), node, rule, subject, since

/** The badge, and under it the state when the alert no longer fires (the rarer case). */
function severityCell(a) {
  return h("td", {}, h("span", { class: `badge ${a.severity}` }, a.severity),
    a.state === "firing" ? null : h("span", { class: "state muted" }, a.state));
}

function nodeCell(node) {
  return node === "_fleet" ? "fleet" : link(["node", node], token(node));
}

function alertRows(a, now, kind = "alert") {
  return [
    h("tr", { class: kind, "data-fingerprint": a.fingerprint, "data-state": a.state, "data-severity": a.severity, "data-rule": a.rule, "data-node": a.node, "data-subject": a.subject },
      severityCell(a),
      h("td", {}, nodeCell(a.node)),
      h("td", {}, token(a.rule)),
      h("td", {}, token(a.subject)),
      h("td", { class: "num" }, fmtAge(now - Number(a.starts_at))),
    ),
    h("tr", { class: `message ${kind}`, "data-fingerprint": a.fingerprint }, h("td", { colspan: COLUMNS }, prose(a.message))),
  ];
}

function counted(values) {
  const counts = new Map();
  for (const v of values) counts.set(v, (counts.get(v) ?? 0) + 1);
  return counts;
}

/** One group of alerts of a rule: a summary row, the members only when opened. */
function groupBody(key, members, now) {
  const first = members[0];
  const open = expanded.has(key);
  const nodes = counted(members.map((a) => a.node));
  const fleetWide = nodes.get("_fleet") ?? 0;
  nodes.delete("_fleet");
  const subjects = new Set(members.map((a) => a.subject));
  const messages = new Set(members.map((a) => a.message));
  const versions = [...new Set(members.map((a) => a.evidence?.versions_seen).filter(Boolean))];
  const where = [...nodes].map(([node, n]) => `${node} ×${n}`).join(", ");
  const places = nodes.size === 0 ? "fleet-wide"
    : `on ${nodes.size} node${nodes.size === 1 ? "" : "s"} (${where})${fleetWide ? ` and ${fleetWide} fleet-wide` : ""}`;
  const summary = `${members.length} ${first.rule} alerts ${places}` +
    (versions.length === 1 ? `; versions seen: ${versions[0]}` : "") + ".";
  const toggle = h("button", {
    type: "button", class: "toggle", "aria-expanded": String(open),
    onclick: () => {
      if (expanded.has(key)) expanded.delete(key);
      else expanded.add(key);
      drawAlerts();
    },
  }, open ? "hide" : `show ${members.length}`);
  return h("tbody", { class: "group", "data-group": key, "data-rule": first.rule, "data-count": members.length, "data-open": String(open) },
    h("tr", { class: "group-head", "data-state": first.state, "data-severity": first.severity, "data-rule": first.rule },
      severityCell(first),
      h("td", {}, nodes.size + (fleetWide ? 1 : 0) === 1 ? nodeCell(first.node)
        : `${nodes.size} nodes${fleetWide ? " + fleet" : ""}`),
      h("td", {}, token(first.rule), " ", h("span", { class: "count" }, members.length)),
      h("td", {}, subjects.size === 1 ? token(first.subject) : `${subjects.size} subjects`),
      h("td", { class: "num" }, fmtAge(now - Math.min(...members.map((a) => Number(a.starts_at))))),
    ),
    h("tr", { class: "message group-head" }, h("td", { colspan: COLUMNS },
      prose(summary), messages.size === 1 ? [h("br"), prose(first.message)] : null, " ", toggle)),
    open ? members.map((a) => alertRows(a, now, "member")) : null,
  );
}

function shownBy(a) {
  if (!filter.severities.has(a.severity)) return false;
  if (!filter.resolved && a.state !== "firing") return false;
  const text = `${a.message} ${a.rule} ${a.node} ${a.subject}`.toLowerCase();
  return filter.words.every((w) => text.includes(w));
}

function drawAlerts() {
  const items = [...alerts.values()].sort((a, b) =>
    (a.state !== "firing") - (b.state !== "firing") ||
    (SEVERITY_RANK[a.severity] ?? 9) - (SEVERITY_RANK[b.severity] ?? 9) ||
    Number(b.starts_at) - Number(a.starts_at));
  const now = Date.now() / 1000;
  const shown = items.filter(shownBy);
  // Entries in the sorted order; a group takes the place of its first member.
  const entries = [];
  const groups = new Map();
  for (const a of shown) {
    if (!GROUPED.test(a.rule)) {
      entries.push([a]);
      continue;
    }
    const key = `${a.rule}|${a.severity}|${a.state}`;
    if (!groups.has(key)) {
      groups.set(key, [a]);
      entries.push([key, groups.get(key)]);
    } else groups.get(key).push(a);
  }
  const bodies = entries.slice(0, MAX_ALERT_ROWS).map(([first, members]) =>
    members && members.length > 1 ? groupBody(first, members, now)
      : h("tbody", { class: "alert" }, alertRows(members ? members[0] : first, now)));
  const table = $("#alerts");
  for (const body of table.querySelectorAll("tbody")) body.remove();
  table.append(...bodies);

  const firing = items.filter((a) => a.state === "firing");
  $("#alerts-count").textContent = String(firing.length);
  for (const s of SEVERITIES) {
    $(`#alerts-severity [data-count=${s}]`).textContent = String(firing.filter((a) => a.severity === s).length);
  }
  const firingShown = shown.filter((a) => a.state === "firing").length;
  const empty = $("#alerts-empty");
  empty.hidden = firingShown > 0;
  empty.textContent = firing.length === 0
    ? "No firing alerts."
    : `No firing alert matches the filter (${firing.length} hidden).`;
  const note = $("#alerts-shown");
  note.hidden = shown.length === items.length;
  note.textContent = `showing ${shown.length} of ${items.length}`;
}

function readFilter() {
  filter.words = $("#alerts-filter").value.toLowerCase().split(/\s+/).filter(Boolean);
  filter.severities = new Set([...document.querySelectorAll("#alerts-severity input:checked")].map((i) => i.value));
  filter.resolved = $("#alerts-resolved").checked;
  drawAlerts();
}

$("#alerts-filters").addEventListener("input", readFilter);
$("#alerts-filters").addEventListener("submit", (event) => event.preventDefault());

// --- the trace chain's arrows ------------------------------------------------------

function markChain() {
  const chain = view.querySelector("#chain");
  if (chain) markRowStarts(chain);
}

new ResizeObserver(markChain).observe(view);

async function startAlerts() {
  stream?.abort();
  const controller = new AbortController();
  stream = controller;
  try {
    const listed = await getJSON("/api/v1/alerts", {}, controller.signal);
    alerts.clear();
    for (const a of listed.items) alerts.set(a.fingerprint, a);
    drawAlerts();
  } catch (error) {
    if (controller.signal.aborted) return;
    if (error instanceof AuthRequired) return askToken(error.message);
    if (error instanceof ApiError && error.status === 404) return setLive("off", "no alert engine");
    return setLive("error", "unreachable");
  }
  followAlerts({
    signal: controller.signal,
    onState: (state) => (state === "auth" ? askToken("token refused") : setLive(state)),
    onEvent: (kind, data) => {
      if (kind === "resync") {
        for (const [fingerprint, a] of alerts) if (a.state === "firing") alerts.delete(fingerprint);
        for (const a of data.alerts ?? []) alerts.set(a.fingerprint, a);
      } else if (kind === "alert") {
        alerts.set(data.fingerprint, data);
      }
      drawAlerts();
    },
  }).catch((error) => setLive("error", error.message));
}

// --- the token prompt --------------------------------------------------------------

function askToken(message) {
  stream?.abort();
  setLive("auth", "token needed");
  const dialog = $("#token-dialog");
  const note = $("#token-error");
  note.textContent = getToken() ? `The token was refused (${message}).` : "";
  note.hidden = !getToken();
  if (!dialog.open) dialog.showModal();
  $("#token-input").focus();
}

$("#token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const input = $("#token-input");
  setToken(input.value.trim());
  input.value = "";
  $("#token-dialog").close();
  render();
  startAlerts();
});

window.addEventListener("hashchange", render);
render();
startAlerts();

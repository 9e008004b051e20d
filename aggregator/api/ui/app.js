// nicfleet status page: hash routes (#/, #/node/NAME, #/trace/NODE/RESOURCE) re-polled
// on a timer, the live alerts panel fed by the SSE stream, and the token prompt that any
// 401 opens. Plain ES modules, no framework, no build step.

import { ApiError, AuthRequired, followAlerts, getToken, getJSON, setToken } from "./api.js";
import { fmtAge, h, link, replace } from "./dom.js";
import { loadFleet, loadNode, loadTrace } from "./views.js";

const REFRESH_MS = { fleet: 5000, node: 2000, trace: 5000 };
const SEVERITY_RANK = { critical: 0, warning: 1, info: 2 };
const MAX_ALERT_ROWS = 200;

const $ = (selector) => document.querySelector(selector);
const view = $("#view");
const alerts = new Map(); // fingerprint -> Alert
let generation = 0;
let timer = null;
let stream = null; // AbortController of the running alert stream

function parseRoute() {
  const parts = window.location.hash.replace(/^#\/?/, "").split("/").filter(Boolean).map(decodeURIComponent);
  if (parts[0] === "node" && parts.length === 2) return { name: "node", node: parts[1] };
  if (parts[0] === "trace" && parts.length === 3) return { name: "trace", node: parts[1], resource: parts[2] };
  return { name: "fleet" };
}

function load(route) {
  if (route.name === "node") return loadNode(route.node);
  if (route.name === "trace") return loadTrace(route.node, route.resource);
  return loadFleet();
}

function crumbs(route) {
  const trail = [link([""], "fleet")];
  if (route.node) trail.push(" / ", link(["node", route.node], route.node));
  if (route.resource) trail.push(" / ", route.resource);
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
        [route.name === "trace" && route.node !== s ? link(["trace", route.node, s], s) : link(["node", s], s), " "]))
      : null);
}

// --- live alerts -------------------------------------------------------------------

function setLive(state, text) {
  const live = $("#live");
  live.dataset.state = state;
  live.textContent = `alerts: ${text ?? state}`;
}

function drawAlerts() {
  const items = [...alerts.values()].sort((a, b) =>
    (a.state !== "firing") - (b.state !== "firing") ||
    (SEVERITY_RANK[a.severity] ?? 9) - (SEVERITY_RANK[b.severity] ?? 9) ||
    Number(b.starts_at) - Number(a.starts_at));
  const now = Date.now() / 1000;
  const rows = items.slice(0, MAX_ALERT_ROWS).map((a) =>
    h("tr", { "data-fingerprint": a.fingerprint, "data-state": a.state, "data-rule": a.rule, "data-node": a.node, "data-subject": a.subject, title: a.message },
      h("td", {}, h("span", { class: `badge ${a.severity}` }, a.severity)),
      h("td", { class: a.state === "firing" ? "bad" : "muted" }, a.state),
      h("td", {}, a.node === "_fleet" ? "fleet" : link(["node", a.node], a.node)),
      h("td", {}, a.rule),
      h("td", {}, a.subject),
      h("td", { class: "num" }, fmtAge(now - Number(a.starts_at))),
    ));
  replace($("#alerts tbody"), rows);
  const firing = items.filter((a) => a.state === "firing").length;
  $("#alerts-count").textContent = String(firing);
  $("#alerts-empty").hidden = firing > 0;
}

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

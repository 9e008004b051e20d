// The three views: the fleet, one node, one resource's trace. Each `load*` fetches what
// it shows and returns a DOM tree; the router re-runs it on a timer.

import { ApiError, getAllJSON, getJSON } from "./api.js";
import { fmtAge, fmtRate, fmtTime, h, link, prose, sparkline, table, token, traceLink } from "./dom.js";
import { topologyView } from "./topology.js";

const SEVERITIES = ["critical", "warning", "info"];
const HISTORY = 60; // samples per port in the sparkline ring buffer
// Counters that count as errors (IBTA PMA port counters and mlx5 queue counters).
const ERROR_COUNTERS = {
  counters: new Set([
    "symbol_error", "link_error_recovery", "link_downed", "port_rcv_errors",
    "port_rcv_remote_physical_errors", "port_rcv_switch_relay_errors", "port_xmit_discards",
    "port_xmit_constraint_errors", "port_rcv_constraint_errors", "local_link_integrity_errors",
    "excessive_buffer_overrun_errors", "VL15_dropped",
  ]),
  hw_counters: new Set([
    "out_of_buffer", "out_of_sequence", "packet_seq_err", "local_ack_timeout_err",
    "rnr_nak_retry_err", "rx_icrc_encapsulated",
  ]),
};

/** node -> {at, last: Map(port -> totals), rates: Map(port -> [{rx, tx, errors}])}. */
const history = new Map();

async function optional(promise) {
  // Findings and alerts exist only where the alert engine runs; a 404 means "not here".
  try {
    return await promise;
  } catch (error) {
    if (error instanceof ApiError && error.status === 404) return null;
    throw error;
  }
}

function stateBadge(state) {
  const cls = state === "ready" || state === "ACTIVE" || state === "ok" ? "ok" : state === "unknown" ? "unknown" : "bad";
  return h("span", { class: `badge ${cls}` }, state);
}

function findingCounts(findings) {
  const counts = new Map();
  for (const f of findings?.items ?? []) {
    const node = f.node ?? "_fleet";
    const entry = counts.get(node) ?? { critical: 0, warning: 0, info: 0 };
    if (SEVERITIES.includes(f.severity)) entry[f.severity] += 1;
    counts.set(node, entry);
  }
  return counts;
}

/** The node's findings per severity in one cell ("3 · 8 · 0"), so the table fits a
 * narrow window; each count colored and titled with its severity. */
function countCells(entry) {
  return h("td", { class: "num counts" }, SEVERITIES.map((s, index) => [index ? " · " : "",
    h("span", { class: entry && entry[s] ? s : "zero", "data-severity": s, title: `${entry ? entry[s] : 0} ${s}` },
      entry ? entry[s] : 0)]));
}

export async function loadFleet() {
  const [nodes, findings, resources] = await Promise.all([
    getAllJSON("/api/v1/nodes"),
    optional(getAllJSON("/api/v1/findings")),
    getJSON("/api/v1/resources"),
  ]);
  const counts = findingCounts(findings);
  const rows = nodes.items.map((n) =>
    h("tr", { "data-node": n.name, "data-state": n.state },
      h("td", {}, link(["node", n.name], token(n.name))),
      h("td", {}, stateBadge(n.state)),
      h("td", { class: "num" }, n.gpus),
      h("td", { class: "num" }, n.devices),
      h("td", { class: "num" }, `${n.ports_active}/${n.ports_total}`),
      h("td", { class: n.ports_down.length ? "bad" : "" }, token(n.ports_down.join(", ") || "—")),
      h("td", { class: "num" }, n.max_rate_gbps === null ? "–" : `${n.max_rate_gbps} Gb/s`),
      countCells(counts.get(n.name)),
      h("td", { class: "num" }, fmtAge(n.age_s)),
    ));
  const fleetWide = counts.get("_fleet");
  const resourceRows = resources.items.map((r) =>
    h("tr", { "data-resource": r.name },
      h("td", {}, token(r.name)),
      h("td", { class: "num" }, `${r.nodes_advertising}/${r.nodes_selected}`),
      h("td", { class: "num" }, r.capacity),
      h("td", { class: "num" }, r.healthy),
      h("td", { class: "num" }, r.allocatable ?? "–"),
      h("td", {}, r.nodes.map((n) => [traceLink(n.node, r.name, token(n.node)), " "])),
    ));
  return h("section", {},
    h("h1", {}, "Fleet ", h("span", { class: "count" }, nodes.total)),
    nodes.items.length === 0
      ? h("p", { class: "muted", id: "fleet-empty" }, "No nodes yet: no agent has reported to this aggregator.")
      : null,
    table(["node", "state", "GPUs", "NICs", "ports up", "ports down", "max rate", "findings: critical · warning · info", "last seen"],
      rows, { id: "fleet" }),
    fleetWide ? h("p", {}, `Fleet-wide findings: ${fleetWide.critical} critical, ${fleetWide.warning} warning, ${fleetWide.info} info.`) : null,
    h("h2", {}, "Resources"),
    resources.items.length === 0
      ? h("p", { class: "muted" }, "No RDMA resource is configured or advertised.")
      : table(["resource", "advertising / selected", "capacity", "healthy", "allocatable", "trace on"], resourceRows, { id: "resources" }),
  );
}

function totals(port) {
  let errors = 0;
  for (const [group, names] of Object.entries(ERROR_COUNTERS)) {
    for (const [name, value] of Object.entries(port[group] ?? {})) {
      if (names.has(name)) errors += Number(value) || 0;
    }
  }
  const bytes = (value) => (value === null || value === undefined ? NaN : Number(value));
  return { rx: bytes(port.rx_bytes), tx: bytes(port.tx_bytes), errors };
}

/** Per-second rates between this poll's counter batch and the previous one, per port. */
function remember(node, counters) {
  const entry = history.get(node) ?? { at: null, last: new Map(), rates: new Map() };
  history.set(node, entry);
  const at = Number(counters?.collected_at);
  if (!counters || !Number.isFinite(at) || at === entry.at) return entry;
  const dt = entry.at === null ? null : at - entry.at;
  for (const port of counters.ports ?? []) {
    const key = `${port.device}/${port.port}`;
    const now = totals(port);
    const before = entry.last.get(key);
    entry.last.set(key, now);
    if (!before || !(dt > 0)) continue;
    // A counter that went down was reset: no rate for that interval.
    const rate = (field) => (now[field] >= before[field] ? (now[field] - before[field]) / dt : NaN);
    const ring = entry.rates.get(key) ?? [];
    ring.push({ rx: rate("rx"), tx: rate("tx"), errors: rate("errors") });
    if (ring.length > HISTORY) ring.splice(0, ring.length - HISTORY);
    entry.rates.set(key, ring);
  }
  entry.at = at;
  return entry;
}

function portsView(snapshot, entry) {
  const rows = [];
  for (const device of snapshot.devices ?? []) {
    for (const port of device.ports ?? []) {
      const key = `${device.name}/${port.port}`;
      const ring = entry.rates.get(key) ?? [];
      const last = ring[ring.length - 1];
      const netdevs = (device.interfaces ?? []).filter((i) => i.port === port.port).map((i) => i.name);
      rows.push(h("tr", { "data-port": key, "data-state": port.state },
        h("td", {}, token(key)),
        h("td", {}, token(netdevs.join(", ") || (device.netdevs ?? []).join(", ") || "–")),
        h("td", {}, port.link_layer),
        h("td", {}, stateBadge(port.state)),
        h("td", {}, port.phys_state ?? "–"),
        h("td", { class: "num" }, port.rate_gbps === null ? "–" : `${port.rate_gbps} Gb/s ${port.rate_speed ?? ""}`),
        h("td", { class: "num" }, last ? fmtRate(last.rx) : "–"),
        h("td", { class: "num" }, last ? fmtRate(last.tx) : "–"),
        h("td", { class: `num ${last && last.errors > 0 ? "bad" : ""}` }, last && Number.isFinite(last.errors) ? `${last.errors.toFixed(1)}/s` : "–"),
        h("td", {}, sparkline(ring.map((s) => s.rx + s.tx), { label: `${key} rx+tx bytes/s`, series: "traffic" }),
          sparkline(ring.map((s) => s.errors), { label: `${key} errors/s`, height: 12, series: "errors" })),
      ));
    }
  }
  return table(["port", "netdev", "link layer", "state", "physical", "rate", "rx", "tx", "errors", "rx+tx / errors"],
    rows, { id: "ports" });
}

function pluginView(node, plugin) {
  if (!plugin) return h("p", { class: "muted", id: "plugin-empty" }, "The agent reports no device plugin.");
  const rows = (plugin.resources ?? []).map((r) =>
    h("tr", { "data-resource": r.name },
      h("td", {}, traceLink(node, r.name, token(r.name))),
      h("td", { class: "num" }, r.advertised),
      h("td", { class: `num ${r.healthy > 0 ? "" : "bad"}` }, r.healthy),
      h("td", {}, token((r.devices ?? []).join(", ") || "–")),
      h("td", {}, stateBadge(r.registration === "registered" ? "ok" : r.registration)),
      h("td", {}, prose([...Object.entries(r.unhealthy ?? {}), ...Object.entries(r.excluded ?? {})]
        .map(([dev, why]) => `${dev}: ${why}`).join("; ") || "–")),
    ));
  return h("div", {},
    h("p", {}, `Config generation ${plugin.config_generation}; registered: ${plugin.registered ? "yes" : "no"}.`),
    table(["resource", "advertised", "healthy", "adapters", "registration", "why not"], rows, { id: "plugin" }));
}

function findingsView(findings) {
  if (!findings) return h("p", { class: "muted" }, "No alert engine on this aggregator.");
  if (findings.items.length === 0) return h("p", { class: "muted", id: "findings-empty" }, "No findings.");
  return table(["severity", "rule", "subject", "message"], findings.items.map((f) =>
    h("tr", { "data-rule": f.rule },
      h("td", {}, h("span", { class: `badge ${f.severity}` }, f.severity)),
      h("td", {}, token(f.rule)), h("td", {}, token(f.subject)), h("td", {}, prose(f.message)))), { id: "findings" });
}

/** The GPUDirect path(s) and IOMMU mode with why (the API's `gpudirect`, one definition
 * with the peermem-missing and iommu-translated rules); nothing before a snapshot. */
function gpudirectView(gd) {
  if (!gd) return null;
  return h("p", { class: "facts", id: "gpudirect", "data-path": gd.path, "data-iommu": gd.iommu },
    "GPUDirect ", h("strong", {}, gd.paths.length ? gd.paths.join(" + ") : gd.path),
    ` (${gd.path_reason.replace(/\.$/, "")}) · IOMMU `, h("strong", {}, gd.iommu), ` (${gd.iommu_reason})`);
}

export async function loadNode(name) {
  const [detail, findings] = await Promise.all([
    getJSON(`/api/v1/nodes/${encodeURIComponent(name)}`),
    optional(getAllJSON("/api/v1/findings", { node: name })),
  ]);
  const s = detail.summary;
  const entry = remember(name, detail.counters);
  const snapshot = detail.snapshot;
  const events = (detail.events ?? []).slice(-10).reverse();
  return h("section", { "data-node": name },
    h("h1", {}, token(name), " ", stateBadge(s.state)),
    h("p", { class: "facts" },
      `${s.gpus} GPUs · ${s.devices} NICs · ${s.ports_active}/${s.ports_total} ports active · `,
      `firmware ${s.firmware.join(", ") || "–"} · agent ${s.agent_version ?? "–"} · last seen ${fmtAge(s.age_s)} ago`),
    gpudirectView(detail.gpudirect),
    h("h2", {}, "GPU × NIC topology"),
    snapshot ? topologyView(snapshot) : h("p", { class: "muted" }, "No snapshot yet."),
    h("h2", {}, "Ports"),
    snapshot ? portsView(snapshot, entry) : h("p", { class: "muted" }, "No snapshot yet."),
    h("h2", {}, "Device plugin"),
    pluginView(name, detail.device_plugin),
    h("h2", {}, "Findings"),
    findingsView(findings),
    h("h2", {}, "Recent link events"),
    events.length === 0 ? h("p", { class: "muted" }, "None.") : table(["observed", "kind", "what", "change"],
      events.map((e) => h("tr", {},
        h("td", {}, fmtTime(e.observed_at)), h("td", {}, e.kind),
        h("td", {}, token([e.device, e.port, e.netdev].filter((x) => x !== null && x !== undefined).join("/"))),
        h("td", {}, `${e.old_state ?? "?"} → ${e.new_state ?? "?"}`))), { id: "events" }),
  );
}

export async function loadTrace(node, resource) {
  const trace = await getJSON("/api/v1/trace", { node, resource });
  const linkBody = (l, title) => [
    h("div", { class: "title" }, token(title), " ", stateBadge(l.status)),
    l.cause ? h("p", { class: "cause" }, prose(l.cause)) : null,
    l.fix ? h("p", { class: "fix" }, "Fix: ", prose(l.fix)) : null,
    h("details", {}, h("summary", {}, "evidence"), h("pre", {}, JSON.stringify(l.evidence, null, 2))),
  ];
  const statusClass = (l) => `link ${["ok", "degraded", "broken", "unknown"].includes(l.status) ? l.status : "unknown"}`;
  const links = trace.links.map((l, index) =>
    h("li", { class: statusClass(l), "data-link": l.name, "data-status": l.status }, ...linkBody(l, `${index}. ${l.name}`)));
  // The cluster's components on the node: a section beside the chain (docs/concepts.md).
  const components = trace.components
    ? h("div", { class: statusClass(trace.components), id: "components", "data-status": trace.components.status },
      ...linkBody(trace.components, "components on the node"))
    : null;
  // The API's verdict (docs/concepts.md): "Every link holds." only when every link is ok.
  const said = { degraded: "Degraded", unknown: "Unknown" }[trace.verdict];
  const verdict = trace.verdict === "ok"
    ? h("p", { class: "ok", id: "verdict", "data-verdict": "ok" }, "Every link holds.")
    : said
      ? h("p", { class: trace.verdict === "degraded" ? "warning" : "unknown", id: "verdict", "data-verdict": trace.verdict }, `${said}: ${trace.verdict_reason}.`)
      : trace.first_broken === null
        ? h("p", { class: "bad", id: "verdict", "data-verdict": "broken" }, "Broken at the node's components.")
        : h("p", { class: "bad", id: "verdict", "data-verdict": "broken" }, `Broken at link ${trace.first_broken}: ${trace.links[trace.first_broken]?.name ?? "?"}.`);
  return h("section", {},
    h("h1", {}, "Trace ", link(["node", node], token(node)), " · ", token(resource)),
    verdict,
    components,
    h("ol", { class: "chain", id: "chain" }, links),
    h("p", { class: "muted" }, `Checked ${fmtTime(trace.checked_at)}.`),
  );
}

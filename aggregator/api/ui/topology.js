// The GPU x NIC heatmap of one snapshot, like `nvidia-smi topo -m`: GPUs numbered in
// PCI address order (the snapshot's order), relations as text and color, NICs without an
// ACTIVE port marked down, and each GPU's best NIC starred. `bestNics` is the twin of
// aggregator/ctl/bestnic.py (what `nicfleetctl topology` marks); a test runs both on the
// same snapshots, so change them together.

import { h } from "./dom.js";

// Closest first; nvidia-smi's legend tokens. NV# (NVLink) cannot occur between a GPU
// and a NIC, but is colored like the closest if a snapshot ever carries it.
export const RELATIONS = ["PIX", "PXB", "PHB", "NODE", "SYS"];
const LEGEND = {
  PIX: "at most one PCIe bridge",
  PXB: "several PCIe bridges, no host bridge",
  PHB: "through a PCIe host bridge (CPU)",
  NODE: "between host bridges of one NUMA node",
  SYS: "across the inter-socket link",
};

// Closest first, X (the GPU itself) included: the rank bestnic.py's relation_rank gives.
const ORDER = ["X", ...RELATIONS];
// A port that passes traffic (proto/ibta.py ACTIVE_STATES).
const ACTIVE_STATES = ["ACTIVE", "ACTIVE_DEFER"];

function rank(relation) {
  if (/^NV\d+$/.test(relation)) return -1;
  const index = ORDER.indexOf(relation);
  return index < 0 ? ORDER.length : index;
}

function relationClass(relation) {
  if (/^NV\d+$/.test(relation)) return "rel-NV";
  return RELATIONS.includes(relation) ? `rel-${relation}` : "rel-other";
}

function nicFacts(snapshot) {
  const facts = new Map();
  for (const device of snapshot.devices ?? []) {
    const active = (device.ports ?? []).filter((p) => ACTIVE_STATES.includes(p.state));
    facts.set(String(device.name), {
      active: active.length > 0,
      rate: Math.max(0, ...active.map((p) => Number(p.rate_gbps) || 0)),
      numa: device.numa_node,
    });
  }
  return facts;
}

function byName(a, b) {
  return a.nic < b.nic ? -1 : a.nic > b.nic ? 1 : 0;
}

/** GPU pci address -> best NIC name: among the NICs with an ACTIVE port, the closest
 * relation, then the fastest ACTIVE port, then the name. Absent when every related NIC is
 * down (or the GPU has no relations). */
export function bestNics(snapshot) {
  const facts = nicFacts(snapshot);
  const byGpu = new Map();
  for (const rel of snapshot.gpu_nic_topology ?? []) {
    const list = byGpu.get(String(rel.gpu)) ?? [];
    list.push({ nic: String(rel.nic), relation: String(rel.relation) });
    byGpu.set(String(rel.gpu), list);
  }
  const best = new Map();
  for (const [gpu, list] of byGpu) {
    const candidates = list.filter((c) => facts.get(c.nic)?.active);
    if (candidates.length === 0) continue;
    candidates.sort(
      (a, b) =>
        rank(a.relation) - rank(b.relation) ||
        (facts.get(b.nic)?.rate ?? 0) - (facts.get(a.nic)?.rate ?? 0) ||
        byName(a, b),
    );
    best.set(gpu, candidates[0].nic);
  }
  return best;
}

export function topologyView(snapshot) {
  const relations = snapshot.gpu_nic_topology ?? [];
  if (relations.length === 0) {
    return h("p", { class: "muted", id: "topology-empty" }, "No GPU/NIC relations in this snapshot.");
  }
  const cell = new Map(relations.map((r) => [`${r.gpu}|${r.nic}`, String(r.relation)]));
  const known = new Set(relations.map((r) => String(r.nic)));
  const nics = (snapshot.devices ?? []).map((d) => String(d.name)).filter((n) => known.has(n));
  for (const nic of known) if (!nics.includes(nic)) nics.push(nic);
  const facts = nicFacts(snapshot);
  const best = bestNics(snapshot);
  const gpus = snapshot.gpus ?? [];
  const header = h("tr", {}, h("th", {}, ""), nics.map((nic) => {
    const up = facts.get(nic)?.active;
    return h("th", { scope: "col", class: up ? "" : "down", "data-down": !up, title: up ? nic : `${nic}: no ACTIVE port, never a best NIC` },
      nic, up ? null : h("span", { class: "sub" }, "down"));
  }));
  const rows = gpus.map((gpu, index) => {
    const label = `GPU${index}`;
    const address = String(gpu.pci_address);
    return h(
      "tr",
      { "data-gpu": label },
      h("th", { scope: "row", title: `${address} (NUMA ${gpu.numa_node ?? "?"})` }, label,
        h("span", { class: "sub" }, address)),
      nics.map((nic) => {
        const relation = cell.get(`${address}|${nic}`) ?? "";
        const isBest = best.get(address) === nic;
        return h(
          "td",
          {
            class: `${relationClass(relation)}${isBest ? " best" : ""}`,
            "data-gpu": label,
            "data-nic": nic,
            "data-rel": relation,
            "data-best": isBest,
            title: `${label} ↔ ${nic}: ${relation}${LEGEND[relation] ? " — " + LEGEND[relation] : ""}${isBest ? " (best NIC)" : ""}`,
          },
          relation,
          isBest ? h("span", { class: "star", "aria-label": "best NIC" }, "★") : null,
        );
      }),
    );
  });
  const legend = h("p", { class: "legend" },
    RELATIONS.map((r) => h("span", { class: `chip ${relationClass(r)}`, title: LEGEND[r] }, r)),
    h("span", { class: "chip best" }, "★ best NIC: closest with an ACTIVE port (then fastest, then name)"),
    h("span", { class: "chip" }, "down: no ACTIVE port"));
  return h("div", { class: "scroll" },
    h("table", { id: "topology", class: "heatmap" }, h("thead", {}, header), h("tbody", {}, rows)),
    legend);
}

// The GPU x NIC heatmap of one snapshot, like `nvidia-smi topo -m`: GPUs numbered in
// PCI address order (the snapshot's order), relations as text and color, and each GPU's
// best NIC marked (the closest NIC with an ACTIVE port; rate breaks ties).

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

function rank(relation) {
  if (/^NV\d+$/.test(relation)) return -1;
  const index = RELATIONS.indexOf(relation);
  return index < 0 ? RELATIONS.length : index;
}

function relationClass(relation) {
  if (/^NV\d+$/.test(relation)) return "rel-NV";
  return RELATIONS.includes(relation) ? `rel-${relation}` : "rel-other";
}

function nicFacts(snapshot) {
  const facts = new Map();
  for (const device of snapshot.devices ?? []) {
    const ports = device.ports ?? [];
    facts.set(String(device.name), {
      active: ports.some((p) => p.state === "ACTIVE"),
      rate: Math.max(0, ...ports.map((p) => Number(p.rate_gbps) || 0)),
      numa: device.numa_node,
    });
  }
  return facts;
}

/** GPU pci address -> best NIC name (or absent when the GPU has no relations). */
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
    const anyActive = list.some((c) => facts.get(c.nic)?.active);
    const candidates = anyActive ? list.filter((c) => facts.get(c.nic)?.active) : list;
    candidates.sort(
      (a, b) =>
        rank(a.relation) - rank(b.relation) ||
        (facts.get(b.nic)?.rate ?? 0) - (facts.get(a.nic)?.rate ?? 0),
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
  const header = h("tr", {}, h("th", {}, ""), nics.map((nic) =>
    h("th", { scope: "col", class: facts.get(nic)?.active ? "" : "down", title: facts.get(nic)?.active ? nic : `${nic}: no ACTIVE port` }, nic),
  ));
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
    h("span", { class: "chip best" }, "★ best NIC: closest with an ACTIVE port"));
  return h("div", { class: "scroll" },
    h("table", { id: "topology", class: "heatmap" }, h("thead", {}, header), h("tbody", {}, rows)),
    legend);
}

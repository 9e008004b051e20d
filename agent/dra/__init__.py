"""nicfleet as a DRA driver (`rdma.nicfleet.io`): the kubelet plugin and its ResourceSlices.

Kubelet side: `plugin` (the DRAPlugin and DRAResourceHealth gRPC services), `pluginrunner`
(sockets and plugin-watcher registration), `pluginclaims` (where allocations come from),
`cdi` (per-claim CDI specs), `checkpoint` (prepared claims across restarts) and `health`
(device health from port states). See docs/dra.md.

May import: `agent.deviceplugin` (sockets, the health rule, CDI conventions), `agent.host`,
`agent.errors`, `proto` (incl. the generated `proto.dra` stubs).
"""

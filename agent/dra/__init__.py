"""nicfleet as a DRA driver (`rdma.nicfleet.io`): the kubelet plugin and its ResourceSlices.

Kubelet side: `plugin` (prepare/unprepare, the DRAPlugin gRPC service), `healthstream`
(the DRAResourceHealth services), `pluginrunner` (sockets, plugin-watcher registration,
`status()`), `claimstatus` (what the agent publishes about the plugin), `pluginclaims`
(where allocations come from), `cdi` (per-claim CDI specs), `checkpoint` (prepared claims
across restarts) and `health` (device health from port states, share copies included).
See docs/dra.md.

May import: `agent.deviceplugin` (sockets, the health rule, CDI conventions), `agent.host`,
`agent.errors`, `proto` (incl. the generated `proto.dra` stubs).
"""

"""The kubelet device plugin: RDMA resources advertised over the v1beta1 gRPC API.

`advertised.AdvertisedResources` is the entry point for the agent service, fed by
`liveconfig.LiveConfig`. Pure decisions live in `plan`, `placement` and `configsource`;
`resource` (serve + register + restart one resource), `server`, `registration`, `sockets`
and `cdi` do the I/O. See docs/device-plugin.md.

May import: `agent.host`, `agent.counters`, `agent.errors`, `proto` (incl. the generated
`proto.deviceplugin` stubs).
"""

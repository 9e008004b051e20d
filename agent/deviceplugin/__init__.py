"""The kubelet device plugin: RDMA resources advertised over the v1beta1 gRPC API.

`manager.DevicePluginManager` is the entry point for the agent service. Pure decisions
live in `plan` and `placement`; `resource` (serve + register + restart one resource),
`server`, `registration` and `cdi` do the I/O. See docs/device-plugin.md.
"""

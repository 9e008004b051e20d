"""The lab simulator: node specs (nodespec, spec, checks, models, synthetic), sysfs trees
rendered from them (layout, render, rdma, pciconfig), faults injected into a rendered tree (faults,
hotplug) and the `lab` command group (cli). Used by tests, benchmarks and the demo in
place of RDMA hardware; the agent itself never imports it.

May import: `agent.errors`, `proto`; inside, acyclic (a layers contract in pyproject.toml).
"""

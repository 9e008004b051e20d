"""The lab simulator: node specs (spec), sysfs trees rendered from them (render), faults
injected into a rendered tree (faults) and the `lab` command group (cli).

Used by tests, benchmarks and the demo in place of RDMA hardware; the agent itself never
imports it.
"""

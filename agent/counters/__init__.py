"""RDMA port counters: finding and reading the files (`reader`), per-second rates with
saturation, wrap and resets (`rates`) and the deltas the agent publishes (`deltas`).

May import: `agent.host.parse`, `agent.errors`, `proto`.
"""

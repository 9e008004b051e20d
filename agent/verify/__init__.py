"""`nicfleet-agent verify`: in-pod evidence (`evidence`; Multus network-status parsed by
`networkstatus`), which pod interfaces are the RDMA ones (`identify`), its verdict
(`verdict`), one run (`run`), the report (`report`), the published validation result
(`publish`), the command (`cli`) and the pair test (`pair`).

May import: `agent.host`, `agent.counters`, `agent.errors`, `proto`.
"""

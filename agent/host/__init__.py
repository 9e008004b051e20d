"""What the host shows of its RDMA path: the sysfs reader under an explicit root
(`sysfs`) and its read deadlines (`deadlines`), pure parsers (`parse`, `pciparse`,
`pciconfig`), RDMA devices (`devices`), PCI functions (`pci`), host facts (`platform`), GPU↔NIC
placement (`topology`), port states (`portstates`), the optional verbs probe (`verbs`) and the
assembled snapshot (`inventory`).

May import: `agent.counters`, `agent.errors`, `proto`.
"""

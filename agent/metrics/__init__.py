"""The agent's Prometheus metrics: the collector that reads the live agent at scrape time
(`collector`) and the per-port and device-plugin families it builds (`ports`, pure).

May import: `agent.host`, `agent.counters`, `agent.links`, `agent.bus`, `agent.deviceplugin`,
`proto`.
"""

"""The agent on NATS: the publisher (`publisher`), its republish in answer to resync requests
(`republish`) and when (`republishpacing`), and the desired device-plugin config (`desired`)
with which of its updates to apply (`desiredorder`).

May import: `agent.host`, `agent.counters`, `agent.errors`, `proto`.
"""

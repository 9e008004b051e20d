"""The agent on NATS: the publisher (`publisher`), the resync requests it answers
(`resync`) and when (`resyncpacing`), and the desired device-plugin config (`desired`).

May import: `agent.host`, `agent.counters`, `agent.errors`, `proto`.
"""

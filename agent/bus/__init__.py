"""The agent on NATS: the publisher (`publisher`), its republish in answer to resync requests
(`republish`) and when (`republishpacing`), and the desired device-plugin config (`desired`).

May import: `agent.host`, `agent.counters`, `agent.errors`, `proto`.
"""

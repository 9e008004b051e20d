"""The fleet view: one immutable record per node, replaced per message (`state`, each
update saying whether it applied), the counter batches it holds (`heldcounters`), live port
state from port events (`portevents`), what is read off a record (`views`), raw messages
turned into updates (`ingest`), the "this node changed" feed (`changefeed`), the node
summaries of the paged API (`summaries`) and the latest snapshots persisted in KV (`store`).

May import: `aggregator.kv`, `aggregator.errors`, `aggregator.metrics`, `proto`. Only `ingest`
and `store` touch NATS; the rest is pure.
"""

"""nicfleet's NATS: a real `nats-server` launched on loopback (`natsserver`), the
permissions of each role (`permissions`), NKey seed files (`keys`) and the resync request
(`resync`: ask every agent to re-publish).

May import: `aggregator.errors`, `proto`.
"""

"""nicfleet's NATS: a real `nats-server` launched on loopback (`natsserver`), the
permissions of each role (`permissions`), NKey seed files (`keys`) and resync requests
(`resyncrequest`: ask agents to republish).

May import: `aggregator.errors`, `proto`.
"""

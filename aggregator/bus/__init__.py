"""nicfleet's NATS: a real `nats-server` launched on loopback (`natsserver`), the
permissions of each role (`permissions`), NKey seed files (`keys`), resync requests
(`resyncrequest`: ask agents to republish) and agents' desired config over core NATS
(`desiredanswer`: answered from KV, announced after writes).

May import: `aggregator.errors`, `proto`.
"""

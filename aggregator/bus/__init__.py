"""nicfleet's NATS: a real `nats-server` launched on loopback (`natsserver`), the
permissions of each role (`permissions`), NKey seed files (`keys`), resync requests
(`resyncrequest`: ask agents to republish) and agents' desired config over core NATS
(`desiredanswer`: answered from KV, announced after writes), and DRA claim allocations
to the agents' kubelet plugins (`claimanswer`, from `aggregator.dra.claims`).

May import: `aggregator.errors`, `aggregator.dra` (pure), `proto`.
"""

"""Link changes: the netlink reader (`netlink`, the only importer of pyroute2), pure netdev
bookkeeping (`netdevs`) and port diffs between two polls (`portdiff`).

May import: `agent.host`, `agent.errors`, `proto`.
"""

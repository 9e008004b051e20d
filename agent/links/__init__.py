"""Link changes: the netlink reader (`netlink`, the only importer of pyroute2), pure netdev
bookkeeping (`netdevs`) and port diffs between two polls (`portdiff`); the loops that run
them for the agent: `follower` (netlink) and `portpoll` (sysfs port states).

May import: `agent.host`, `agent.errors`, `proto`.
"""

"""nicfleet agent: reads RDMA adapters on one host and publishes what it sees."""

__version__ = "0.1.0"

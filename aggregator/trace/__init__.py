"""The chain trace: why a node does (or does not) offer an RDMA resource, link by link
(`chain`), its host side (`host`) and the per-resource view (`resources`). Pure.

May import: `aggregator.fleet`, `aggregator.cluster`, `proto`.
"""

"""Pair validations: the POST body parsed and checked (`request`), the record and its
pure decisions (`record`), and the runner that creates Pods and collects results (`runner`).

May import: `aggregator.fleet`, `trace`, `kube`, `kv`, `bus`, `cluster`, `proto`.
"""

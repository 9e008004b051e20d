"""Reconcile a cluster policy: the pure plan (`plan`) and policy status (`status`), node
labels (`nodelabels`), the policies in force (`policies`), the NVIDIA NicClusterPolicy audit
(`nvidia`), the I/O half that performs a plan (`apply`) and the loop that re-plans (`loop`).

May import: `aggregator.fleet`, `rules`, `trace`, `kube`, `kv`, `bus`, `cluster`, `proto`.
"""

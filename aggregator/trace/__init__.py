"""The chain trace: why a node does (or does not) offer an RDMA resource, link by link
(`chain`), its host side (`host`), the cluster's components on the node (`components`),
why pods are not scheduled (`scheduling`), one pod's own chain (`pod`), the pods'
secondary networks (`attachment`), their IP pools (`ippool`), the interfaces the pod
sees (`podinterface`), a pod's DRA claim chains (`dra`, `draclaim`, `draalloc`) and the
per-resource view (`resources`). Pure.

May import: `aggregator.fleet`, `aggregator.cluster`, `aggregator.podnetworks`,
`aggregator.dra` (its pure modules), `proto`.
"""

"""Every Kubernetes API call the aggregator makes (`client`, the only importer of the
`kubernetes` package), the bodies those calls send and the decoding of their answers
(`payloads`, pure), API objects turned into the cluster model (`objects`, pure; NAD CNI
configs, `network-status` and IP pools in `networks`; DRA claims, slices and classes in
`draobjects`) and the watches that keep that model current (`watch`).

May import: `aggregator.cluster`, `aggregator.dra`, `aggregator.errors`, `proto`.
"""

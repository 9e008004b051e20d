"""The HTTP API (aiohttp): the app and its routes per area (`app`, `alerts`, `chain`,
`validations`, `shards`, `statuspage` with the static `ui/`), bearer-token and TokenReview
auth, the JSON error shape, the OpenAPI document, paging and label selectors, and the
bounds against hostile clients (`limits`, `connections`, `jsonbody`).

May import everything below it: `aggregator.replicas`, `reconcile`, `validations`, `alerts`,
`fleet`, `rules`, `trace`, `kube`, `kv`, `bus`, and `proto`. Nothing imports it but the
service and the CLI.
"""

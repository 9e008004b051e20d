"""`nicfleetctl`, the operator CLI: it talks only to the aggregator's HTTP API (`client`,
httpx), renders tables (`render`, rich) and runs the offline `check` on snapshot files.

May import: `proto` (the wire and `proto.http` response types), `aggregator.rules` (for
`check`) and `aggregator.errors` (the exception root) — checked by an import-linter contract.
"""

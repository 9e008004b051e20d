"""Dynamic Resource Allocation, seen from the fleet: why a ResourceClaim can or cannot be
allocated on each node (`explain`), from ResourceClaims, DeviceClasses and ResourceSlices
as plain dicts (`objects`), with CEL selectors run by a real CEL implementation (`celenv`).

Pure: no I/O, no clock, no logging; imports only proto, the standard library, and `cel`.
The CLI (aggregator.ctl.claim) reads the files or asks the aggregator. The one exception
is `publisher` (`--dra-publish`), the loop that writes the ResourceSlices `publishplan`
plans: it reaches the API, the change feed and the fleet only through protocols it
declares, so the package still imports nothing above aggregator.errors.
"""

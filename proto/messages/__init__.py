"""Every wire message besides the snapshot, one module per family: counters, events,
device-plugin status, desired config, alerts, control (resync), validation, shards,
DRA claims.

Each top-level message carries a `schema` tag and a `version`; fields added later must
have defaults so that older payloads keep decoding. Imports only msgspec, the standard
library and `proto.inventory`; this module holds only the messages' version.
"""

from __future__ import annotations

from typing import Final

MESSAGES_VERSION: Final = 1

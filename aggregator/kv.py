"""Read a whole KV bucket while others write to it (sharded replicas, docs/scaling.md).

nats-py's `keys()` misses keys updated meanwhile (74 of 100 listings of 30 keys with one
writer), and a pass to the last sequence read first ends early when that key is rewritten;
the stream's subject list names every key, and a watch has read them all once it delivered
each."""

from __future__ import annotations

from nats.errors import Error as NatsError
from nats.js.client import JetStreamContext
from nats.js.errors import Error as JetStreamError

from aggregator.errors import StoreError


async def bucket_keys(js: JetStreamContext, bucket: str) -> set[str]:
    """Every key with a message in the bucket (put, delete or purge marker)."""
    prefix = f"$KV.{bucket}."
    try:
        info = await js.stream_info(f"KV_{bucket}", subjects_filter=f"{prefix}>")
    except (TimeoutError, NatsError, JetStreamError) as exc:
        raise StoreError(f"cannot list the keys of KV bucket {bucket}: {exc}") from exc
    return {subject[len(prefix) :] for subject in (info.state.subjects or {})}

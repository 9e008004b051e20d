"""The aggregator's exception tree; lower-level errors are translated at the boundary.

AggregatorError
├── EmbeddedNatsError   the bundled nats-server could not start or died (permanent)
├── StoreError          a KV read/write failed (retryable: the bucket may come back)
└── SettingsError       bad command-line or policy input (permanent, exit code 2)
"""

from __future__ import annotations


class AggregatorError(Exception):
    """Base of every error the aggregator raises on purpose."""


class EmbeddedNatsError(AggregatorError):
    """The embedded nats-server could not be started or stopped."""


class StoreError(AggregatorError):
    """Reading or writing a JetStream KV bucket failed."""


class SettingsError(AggregatorError):
    """Invalid settings given on the command line or in a file."""

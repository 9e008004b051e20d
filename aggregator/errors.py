"""The aggregator's exception tree; lower-level errors are translated at the boundary.

AggregatorError
├── EmbeddedNatsError   the bundled nats-server could not start or died (permanent)
├── StoreError          a KV read/write failed (retryable: the bucket may come back)
├── SettingsError       bad command-line or policy input (permanent, exit code 2)
└── KubeError           a Kubernetes API call failed (permanent: 4xx, bad kubeconfig)
    ├── KubeNotFoundError     the object or its resource type is absent (404)
    └── KubeUnavailableError  no connection, 5xx or 429 (retryable)
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


class KubeError(AggregatorError):
    """A Kubernetes API call failed for a reason retrying will not fix (4xx, bad config)."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status  # HTTP status from the API server, None without a response


class KubeNotFoundError(KubeError):
    """The object, or its whole resource type (CRD not installed), does not exist."""


class KubeUnavailableError(KubeError):
    """The API server could not be reached or answered 5xx/429 (retryable)."""

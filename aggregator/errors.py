"""The aggregator's exception tree; lower-level errors are translated at the boundary.

Retryable vs permanent is the class attribute `retryable` (False unless the class line says
`retryable=True`), never a string or a marker class: `KubeUnavailableError` is a KubeError
that is retryable. Classes keep a builtin base where callers catch it (`LookupError`,
`ValueError`, `click.ClickException`). tests/unit/test_error_trees.py checks this tree,
and its (retryable) marks, against the code.

AggregatorError
├── EmbeddedNatsError       the bundled nats-server could not start or died
├── StoreError              a KV read/write failed (retryable)
├── SettingsError           bad command-line or policy input (exit code 2)
├── FlagError               `run` flags that cannot work together, or an unusable file (2)
├── KubeError               a Kubernetes API call failed (4xx, bad kubeconfig)
│   ├── KubeNotFoundError     the object or its resource type is absent (404)
│   └── KubeUnavailableError  no connection, 5xx or 429 (retryable)
├── ThresholdError          an invalid `alerts` entry in a policy (a ValueError)
├── Abandoned               rule evaluation gave up when asked to; the next call starts over
├── UnknownNode             a trace for a node the fleet does not hold (a LookupError)
├── UnknownPod              a pod trace for a pod the cluster view does not hold (a LookupError)
├── UnknownResource         a trace for a resource the node does not offer (a LookupError)
├── InvalidValidationRequest  a validation request body that is not valid (a ValueError)
├── UnknownValidationNode   a validation of a node the fleet does not hold (a LookupError)
├── ResourceNotAdvertised   a validation of a resource the nodes do not offer (a LookupError)
├── RejectedResult          a result message of another validation (a ValueError)
├── ValidationBusy          too many validations queued, HTTP 429 (retryable)
├── ValidationUnavailable   no Kubernetes API to create validation pods in, HTTP 503
├── BadParameter            an API query or path parameter that fails validation (400)
├── CalloutRequestError     an auth-callout request not signed by a server (a ValueError)
├── IpamError               an IP pool the IPAM plugin would refuse for every pod (a ValueError)
├── InvalidObject           a DRA document that is not the object it should be (a ValueError)
├── CelCompileError         a DRA CEL selector that does not compile (a ValueError)
├── CelRuntimeError         a DRA CEL selector that failed on a device (a ValueError)
├── BodyError               a request body over its size/depth bound or not JSON (a ValueError)
├── PagingError             a bad `limit`, `offset` or `continue` (a ValueError)
├── TokenFileError          an API token file that cannot be used (a ValueError)
├── UndocumentedRoute       an API route without an OpenAPI entry (a LookupError)
├── ServiceNotStarted       the service's runtime was used before it started (a RuntimeError)
├── CtlError                nicfleetctl: a failed command (a click.ClickException)
│   ├── ApiError              the API answered with an error
│   │   ├── NodeNotFound        a node the aggregator does not know, with close matches
│   │   └── UnknownName         a filter names no node, rule or resource it knows (exit 1)
│   ├── BadInput              the request was rejected as invalid (exit 2)
│   ├── Unreachable           the aggregator could not be reached (retryable)
│   └── AuthRefused           the API refused the token
├── CtlConfigError          nicfleetctl: the context file is unreadable or invalid
├── CheckInputError         nicfleetctl check: unusable offline input
└── DemoError               nicfleetctl demo: the demo fleet could not be started
"""

from __future__ import annotations

from typing import ClassVar


class AggregatorError(Exception):
    """Base of every error the aggregator raises on purpose.

    `retryable` is a property of the class: a subclass that may succeed when tried again
    says so in its class line (`class X(AggregatorError, retryable=True)`).
    """

    retryable: ClassVar[bool] = False

    def __init_subclass__(cls, *, retryable: bool | None = None, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if retryable is not None:
            cls.retryable = retryable


class EmbeddedNatsError(AggregatorError):
    """The embedded nats-server could not be started or stopped."""


class StoreError(AggregatorError, retryable=True):
    """Reading or writing a JetStream KV bucket failed."""


class SettingsError(AggregatorError):
    """Invalid settings given on the command line or in a file."""


class KubeError(AggregatorError):
    """A Kubernetes API call failed; permanent (4xx, bad config) unless a subclass says."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status  # HTTP status from the API server, None without a response


class KubeNotFoundError(KubeError):
    """The object, or its whole resource type (CRD not installed), does not exist."""


class KubeUnavailableError(KubeError, retryable=True):
    """The API server could not be reached or answered 5xx/429 (retryable)."""

"""The wire contract's exception tree: what proto raises on purpose. Stdlib only, no I/O.

Every class keeps `ValueError` too (callers catch that); `retryable` says whether the same
input may succeed later: never, for a payload or a document (tests/unit/test_error_trees.py
checks this tree against the code).

    ProtoError
    ├── CodecError          a payload that is not a valid message of the expected type
    ├── PackError           a packed counter batch whose indexes do not fit its name table
    ├── _Misfiled           a packing layout lists a name under a foreign group (internal)
    ├── ConfigError         a device-plugin config that is not valid (proto.dpconfig)
    ├── Invalid             one bad field found decoding a device-plugin config (unnamed yet)
    ├── PolicyError         a NicFleetPolicy document that is not valid
    ├── GoJsonError         a document Go's encoding/json would refuse (proto.gojson)
    ├── InvalidNodeName     not a Kubernetes node name, so no subject token
    ├── InvalidDeviceName   not (convertible to) a DRA device name (proto.dranames)
    ├── InvalidSliceSettings  ResourceSlice settings that describe no pool (proto.draslices)
    ├── InvalidValidationId not a subject token (or a Pod name suffix)
    └── NatsSecurityError   a NATS credential or TLS setting that cannot be used (runtime)
"""

from __future__ import annotations

from typing import ClassVar


class ProtoError(Exception):
    """Base of every error proto raises on purpose.

    `retryable` is a property of the class: a subclass that may succeed when tried again
    says so in its class line (`class X(ProtoError, retryable=True)`).
    """

    retryable: ClassVar[bool] = False

    def __init_subclass__(cls, *, retryable: bool | None = None, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if retryable is not None:
            cls.retryable = retryable

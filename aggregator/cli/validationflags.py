"""The `--validation-*` flags of `nicfleet-aggregator run`: the pair-validation pods'
template, namespace and NATS URL (docs/validation.md).

One decorator adds them and hands the command `validation_flags`; `with_validation_flags`
folds them into `AggregatorSettings`. A bad value is one `error:` line and exit 2.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from aggregator.service import AggregatorSettings

EXIT_USAGE = 2
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")

_OPTIONS = (
    click.option("--validation-template", type=click.Path(path_type=Path, exists=True,
                 dir_okay=False), help="Pod template of pair validations (mount "
                 "deploy/validation/pod-template.yaml from a ConfigMap). Default: the one "
                 "of the source tree."),
    click.option("--validation-namespace", metavar="NAMESPACE",
                 help="Namespace of the pair-validation pods. Default: nicfleet-system."),
    click.option("--validation-nats-url", metavar="URL",
                 help="NATS URL the validation pods publish their results to. Default: "
                 "nats://nicfleet-nats.nicfleet-system.svc:4222."),
)  # fmt: skip


@dataclasses.dataclass(frozen=True, kw_only=True)
class ValidationFlags:
    template: Path | None = None
    namespace: str | None = None
    nats_url: str | None = None


def validation_options(command: Callable[..., None]) -> Callable[..., None]:
    """Add the flags; the command receives `validation_flags` instead of them."""

    @functools.wraps(command)
    def wrapper(
        *args: Any,
        validation_template: Path | None,
        validation_namespace: str | None,
        validation_nats_url: str | None,
        **kwargs: Any,
    ) -> None:
        if validation_namespace is not None and not _NAMESPACE.fullmatch(validation_namespace):
            _fail("--validation-namespace", f"{validation_namespace!r} is not a DNS-1123 label")
        if validation_nats_url is not None and not validation_nats_url.startswith(
            ("nats://", "tls://")
        ):
            _fail("--validation-nats-url", f"{validation_nats_url!r} is not a nats:// URL")
        flags = ValidationFlags(
            template=validation_template,
            namespace=validation_namespace,
            nats_url=validation_nats_url,
        )
        command(*args, validation_flags=flags, **kwargs)

    for option in reversed(_OPTIONS):
        wrapper = option(wrapper)
    return wrapper


def with_validation_flags(
    settings: AggregatorSettings, flags: ValidationFlags
) -> AggregatorSettings:
    replace = dataclasses.replace
    if flags.template is not None:
        settings = replace(settings, validation_template=flags.template)
    if flags.nats_url is not None:
        settings = replace(
            settings, validation=replace(settings.validation, nats_url=flags.nats_url)
        )
    if flags.namespace is not None and settings.kube is not None:
        kube = replace(settings.kube, validation_namespace=flags.namespace)
        settings = replace(settings, kube=kube)
    return settings


def _fail(flag: str, message: str) -> None:
    click.echo(f"error: {flag}: {message}", err=True)
    raise SystemExit(EXIT_USAGE)

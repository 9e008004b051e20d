"""The `--api-token-review` / `--api-review-*` flags of `nicfleet-aggregator run`.

One decorator adds them and hands the command `api_token_review` (`ReviewSettings`, or
None when TokenReview is off); a `--api-review-*` flag without `--api-token-review` is exit 2.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import click

from aggregator.api.tokenreview import DEFAULT_ADMIN_GROUPS, DEFAULT_READ_GROUPS, ReviewSettings

EXIT_USAGE = 2

_OPTIONS = (
    click.option("--api-token-review", is_flag=True,
                 help="Check API bearer tokens not in --api-token-file with the Kubernetes "
                 "TokenReview API (ServiceAccount and user tokens); needs --in-cluster, "
                 "--kubeconfig or --kube-api, and RBAC 'create' on tokenreviews."),
    click.option("--api-review-read-group", multiple=True, metavar="GROUP",
                 help="Reviewed identities in this group get the read scope (repeatable). "
                 f"Default: {', '.join(DEFAULT_READ_GROUPS)}."),
    click.option("--api-review-admin-group", multiple=True, metavar="GROUP",
                 help="Reviewed identities in this group get the admin scope (repeatable). "
                 f"Default: {', '.join(DEFAULT_ADMIN_GROUPS)}."),
    click.option("--api-review-read-user", multiple=True, metavar="USER",
                 help="This reviewed user name gets the read scope (repeatable), e.g. "
                 "system:serviceaccount:monitoring:prometheus."),
    click.option("--api-review-admin-user", multiple=True, metavar="USER",
                 help="This reviewed user name gets the admin scope (repeatable)."),
    click.option("--api-review-audience", multiple=True, metavar="AUDIENCE",
                 help="Accept only tokens issued for this audience (repeatable), e.g. "
                 "projected ServiceAccount tokens with audience nicfleet. "
                 "Default: the API server's own audience."),
)  # fmt: skip


def token_review_options(command: Callable[..., None]) -> Callable[..., None]:
    """Add the flags; the command receives `api_token_review` instead of them."""

    @functools.wraps(command)
    def wrapper(
        *args: Any,
        api_token_review: bool,
        api_review_read_group: tuple[str, ...],
        api_review_admin_group: tuple[str, ...],
        api_review_read_user: tuple[str, ...],
        api_review_admin_user: tuple[str, ...],
        api_review_audience: tuple[str, ...],
        **kwargs: Any,
    ) -> None:
        given = {
            "--api-review-read-group": api_review_read_group,
            "--api-review-admin-group": api_review_admin_group,
            "--api-review-read-user": api_review_read_user,
            "--api-review-admin-user": api_review_admin_user,
            "--api-review-audience": api_review_audience,
        }
        for flag, values in given.items():
            if values and not api_token_review:
                click.echo(f"error: {flag}: needs --api-token-review", err=True)
                raise SystemExit(EXIT_USAGE)
            if any(not value.strip() for value in values):
                click.echo(f"error: {flag}: must not be empty", err=True)
                raise SystemExit(EXIT_USAGE)
        settings = (
            ReviewSettings(
                read_groups=api_review_read_group or DEFAULT_READ_GROUPS,
                admin_groups=api_review_admin_group or DEFAULT_ADMIN_GROUPS,
                read_users=api_review_read_user,
                admin_users=api_review_admin_user,
                audiences=api_review_audience,
            )
            if api_token_review
            else None
        )
        command(*args, api_token_review=settings, **kwargs)

    for option in reversed(_OPTIONS):
        wrapper = option(wrapper)
    return wrapper

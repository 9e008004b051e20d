"""aggregator.api.tokenreview: the pure identity → scope mapping, the TokenReview answer parser,
the TTL cache (injected clock) and single-flight, with a fake `review` function."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from aggregator.api.tokenreview import (
    Allowed,
    Refused,
    ReviewCache,
    ReviewSettings,
    TokenReviewer,
    Unavailable,
    decide,
    token_key,
)
from aggregator.errors import KubeError, KubeUnavailableError
from aggregator.kube.objects import TokenReviewResult, result_from_review

TOKEN = "eyJhbGciOiJSUzI1NiJ9.payload-0123456789.signature"
DEFAULTS = ReviewSettings()


def who(
    username: str = "alice", *groups: str, audiences: tuple[str, ...] = ()
) -> TokenReviewResult:
    return TokenReviewResult(
        authenticated=True, username=username, groups=groups, audiences=audiences
    )


@pytest.mark.parametrize(
    ("result", "settings", "expected"),
    [
        pytest.param(who("a", "nicfleet:admins"), DEFAULTS, Allowed("admin", "a"), id="admin"),
        pytest.param(who("r", "nicfleet:readers"), DEFAULTS, Allowed("read", "r"), id="read"),
        pytest.param(
            who("both", "nicfleet:readers", "nicfleet:admins"),
            DEFAULTS,
            Allowed("admin", "both"),
            id="both-groups-admin-wins",
        ),
        pytest.param(
            who("sa", "system:serviceaccounts"),
            ReviewSettings(read_users=("sa",)),
            Allowed("read", "sa"),
            id="read-user",
        ),
        pytest.param(
            who("root"),
            ReviewSettings(admin_users=("root",)),
            Allowed("admin", "root"),
            id="admin-user",
        ),
        pytest.param(
            who("ops", "ops"),
            ReviewSettings(admin_groups=("ops",), read_groups=()),
            Allowed("admin", "ops"),
            id="custom-admin-group",
        ),
        pytest.param(
            who("x", "nicfleet:readers", audiences=("nicfleet",)),
            ReviewSettings(audiences=("nicfleet", "other")),
            Allowed("read", "x"),
            id="audience-matches",
        ),
    ],
)
def test_allowed(result: TokenReviewResult, settings: ReviewSettings, expected: Allowed) -> None:
    assert decide(result, settings) == expected


@pytest.mark.parametrize(
    ("result", "settings", "kind", "fragment"),
    [
        pytest.param(
            TokenReviewResult(authenticated=False, error="token expired"),
            DEFAULTS,
            "unauthenticated",
            "token expired",
            id="not-authenticated",
        ),
        pytest.param(
            TokenReviewResult(authenticated=True, groups=("nicfleet:admins",)),
            DEFAULTS,
            "unauthenticated",
            "invalid bearer token",
            id="authenticated-without-username",
        ),
        pytest.param(
            who("bob", "system:authenticated"),
            DEFAULTS,
            "forbidden",
            "authenticated as bob but not allowed",
            id="unknown-group",
        ),
        pytest.param(
            who("bob", "nicfleet:admins"),
            ReviewSettings(admin_groups=("ops",)),
            "forbidden",
            "'ops'",
            id="default-replaced",
        ),
        pytest.param(
            who("x", "nicfleet:admins"),
            ReviewSettings(audiences=("nicfleet",)),
            "unauthenticated",
            "audience nicfleet",
            id="api-server-audience-when-we-asked-ours",
        ),
        pytest.param(
            who("x", "nicfleet:admins", audiences=("vault",)),
            ReviewSettings(audiences=("nicfleet",)),
            "unauthenticated",
            "audience",
            id="other-audience",
        ),
    ],
)
def test_refused(
    result: TokenReviewResult, settings: ReviewSettings, kind: str, fragment: str
) -> None:
    decision = decide(result, settings)
    assert isinstance(decision, Refused)
    assert decision.kind == kind
    assert fragment in decision.message


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        pytest.param(
            {
                "kind": "TokenReview",
                "status": {
                    "authenticated": True,
                    "user": {"username": "u", "uid": "1", "groups": ["g", 7, "h"]},
                    "audiences": ["nicfleet"],
                },
            },
            TokenReviewResult(
                authenticated=True,
                username="u",
                uid="1",
                groups=("g", "h"),
                audiences=("nicfleet",),
            ),
            id="full",
        ),
        pytest.param(
            {"status": {"authenticated": False, "error": "invalid"}},
            TokenReviewResult(authenticated=False, error="invalid"),
            id="refused",
        ),
        pytest.param(
            {"status": {"authenticated": "true", "user": {"username": "u"}}},
            TokenReviewResult(authenticated=False, username="u"),
            id="string-true-is-not-true",
        ),
        pytest.param({"status": {}}, TokenReviewResult(authenticated=False), id="empty-status"),
    ],
)
def test_result_from_review(raw: Any, expected: TokenReviewResult) -> None:
    assert result_from_review(raw) == expected


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        pytest.param(None, "not an object", id="null"),
        pytest.param([], "not an object", id="list"),
        pytest.param({"spec": {}}, "no status", id="no-status"),
        pytest.param({"status": {"user": "u"}}, "status.user", id="user-not-object"),
    ],
)
def test_result_from_review_refuses_other_answers(raw: Any, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        result_from_review(raw)


def test_cache_is_keyed_by_digest_and_bounded() -> None:
    cache = ReviewCache(max_entries=2)
    keys = [token_key(f"{TOKEN}-{i}") for i in range(3)]
    assert all(len(k) == 32 and TOKEN.encode() not in k for k in keys)
    for key in keys:
        cache.put(key, Allowed("read", "u"), expires=100.0)
    assert len(cache) == 2
    assert cache.get(keys[0], 0.0) is None  # the oldest went first
    assert cache.get(keys[2], 99.9) == Allowed("read", "u")
    assert cache.get(keys[2], 100.0) is None  # expired, and dropped
    assert len(cache) == 1


class FakeReview:
    """Stands in for `KubeClient.review_token`: answers from a table, counts calls."""

    def __init__(self) -> None:
        self.answers: dict[str, TokenReviewResult | Exception] = {}
        self.calls: list[tuple[str, tuple[str, ...]]] = []
        self.gate: asyncio.Event | None = None
        self.entered = asyncio.Event()

    async def __call__(self, token: str, audiences: tuple[str, ...]) -> TokenReviewResult:
        self.calls.append((token, audiences))
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        answer = self.answers.get(token, TokenReviewResult(authenticated=False))
        if isinstance(answer, Exception):
            raise answer
        return answer


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def reviewer(fake: FakeReview, clock: Clock, **settings: Any) -> TokenReviewer:
    return TokenReviewer(fake, ReviewSettings(**settings), clock=clock)


async def test_positive_answers_are_cached_for_the_positive_ttl() -> None:
    fake, clock = FakeReview(), Clock()
    auth = reviewer(fake, clock, audiences=("nicfleet",), positive_ttl_s=60.0)
    fake.answers[TOKEN] = who("alice", "nicfleet:readers", audiences=("nicfleet",))
    assert await auth.authenticate(TOKEN) == Allowed("read", "alice")
    clock.now += 59.9
    assert await auth.authenticate(TOKEN) == Allowed("read", "alice")
    assert fake.calls == [(TOKEN, ("nicfleet",))]
    clock.now += 0.1
    await auth.authenticate(TOKEN)
    assert len(fake.calls) == 2


async def test_negative_answers_expire_sooner() -> None:
    fake, clock = FakeReview(), Clock()
    auth = reviewer(fake, clock, negative_ttl_s=10.0, positive_ttl_s=60.0)
    first = await auth.authenticate(TOKEN)
    assert isinstance(first, Refused) and first.kind == "unauthenticated"
    clock.now += 9.9
    await auth.authenticate(TOKEN)
    assert len(fake.calls) == 1
    fake.answers[TOKEN] = who("alice", "nicfleet:admins")  # e.g. the token became valid
    clock.now += 0.1
    assert await auth.authenticate(TOKEN) == Allowed("admin", "alice")
    assert len(fake.calls) == 2


async def test_forbidden_identity_is_cached_like_a_positive_answer() -> None:
    fake, clock = FakeReview(), Clock()
    fake.answers[TOKEN] = who("bob")
    auth = reviewer(fake, clock, negative_ttl_s=10.0, positive_ttl_s=60.0)
    assert isinstance(await auth.authenticate(TOKEN), Refused)
    clock.now += 30
    assert isinstance(await auth.authenticate(TOKEN), Refused)
    assert len(fake.calls) == 1


@pytest.mark.parametrize(
    ("error", "fragment"),
    [
        pytest.param(KubeUnavailableError("create TokenReview: ClientConnectorError"),
                     "ClientConnectorError", id="unreachable"),
        pytest.param(KubeError("create TokenReview: 403 forbidden", status=403),
                     "system:auth-delegator", id="rbac-missing"),
    ],
)  # fmt: skip
async def test_failed_review_is_unavailable_and_not_cached(error: Exception, fragment: str) -> None:
    fake, clock = FakeReview(), Clock()
    fake.answers[TOKEN] = error
    auth = reviewer(fake, clock)
    decision = await auth.authenticate(TOKEN)
    assert isinstance(decision, Unavailable)
    assert fragment in decision.message
    assert TOKEN not in decision.message
    fake.answers[TOKEN] = who("alice", "nicfleet:readers")  # the API server is back
    assert await auth.authenticate(TOKEN) == Allowed("read", "alice")
    assert len(fake.calls) == 2


async def test_a_burst_for_one_token_makes_one_review() -> None:
    fake, clock = FakeReview(), Clock()
    fake.answers[TOKEN] = who("alice", "nicfleet:admins")
    fake.gate = asyncio.Event()
    auth = reviewer(fake, clock)
    async with asyncio.TaskGroup() as tasks:
        burst = [tasks.create_task(auth.authenticate(TOKEN)) for _ in range(50)]
        await asyncio.wait_for(fake.entered.wait(), 5)
        other = tasks.create_task(auth.authenticate(TOKEN + "-other"))
        fake.gate.set()
    assert {task.result() for task in burst} == {Allowed("admin", "alice")}
    assert isinstance(other.result(), Refused)
    assert [token for token, _ in fake.calls] == [TOKEN, TOKEN + "-other"]
    assert auth.reviews == 2


async def test_a_cancelled_review_releases_its_waiters() -> None:
    fake, clock = FakeReview(), Clock()
    fake.answers[TOKEN] = who("alice", "nicfleet:admins")
    fake.gate = asyncio.Event()
    auth = reviewer(fake, clock)
    first = asyncio.create_task(auth.authenticate(TOKEN))
    await asyncio.wait_for(fake.entered.wait(), 5)
    waiter = asyncio.create_task(auth.authenticate(TOKEN))
    await asyncio.sleep(0)  # one loop turn: the waiter joins the review in flight
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    assert isinstance(await asyncio.wait_for(waiter, 5), Unavailable)
    fake.gate.set()
    assert await auth.authenticate(TOKEN) == Allowed("admin", "alice")  # nothing stuck


def test_nothing_shows_the_token() -> None:
    fake, clock = FakeReview(), Clock()
    auth = reviewer(fake, clock)
    auth.cache.put(token_key(TOKEN), Allowed("read", "u"), expires=2000.0)
    assert TOKEN not in repr(auth) and TOKEN not in repr(auth.cache)

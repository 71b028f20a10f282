"""What a worker found on Bonjour really is: contacted with a Hello, and checked against a target.

An advertisement says what a worker claims; only a Hello over gRPC,
carrying the token's proof, says whether the worker answers, whether it
takes this machine's token and can prove its own, and what it really
serves. ``survey`` contacts every worker found, at once, and checks each
Hello as drafting would (``selection.check_hello``): the protocol version,
the stream backend and the vocabulary. ``coordinator discover`` prints the
result, and ``coordinator serve`` gives it as the reason a worker is
skipped. Only the target's vocabulary fingerprint is needed, never its
weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import anyio

from coordinator.workers.connection import WorkerConnection, connect
from coordinator.workers.credentials import Credentials
from coordinator.workers.selection import check_hello
from specwire.errors import AuthenticationError, RemoteWorkerError, SpecwireError
from specwire.wire.bonjour import WorkerAdvert
from specwire.wire.protocol import BACKEND_STREAM, PROTOCOL_VERSION

HELLO_TIMEOUT_S = 5.0
TOKEN_ACCEPTED = "yes"
TOKEN_REJECTED = "rejected"  # the worker refused this machine's proof (another token)
TOKEN_UNPROVEN = "unproven"  # the worker answered, but could not prove it holds the token
UNREACHABLE = "unreachable"
_REFUSED = {"UNAUTHENTICATED", "PERMISSION_DENIED"}


@dataclass(frozen=True)
class WorkerCheck:
    """One worker as contacted: what it advertised, what its Hello said, and whether it can draft.

    ``model``, ``fingerprint`` and ``protocol_version`` are the Hello's when
    it answered (``answered``), else the advertisement's. ``token`` is
    ``yes``, ``rejected``, ``unproven`` or ``unreachable``; ``why_not`` says
    why the worker cannot draft for the target (None: it can).
    """

    advert: WorkerAdvert
    answered: bool
    model: str
    fingerprint: str
    protocol_version: int
    token: str
    why_not: str | None
    draft_tok_s: float

    @property
    def name(self) -> str:
        """The worker's Bonjour name."""
        return self.advert.name

    @property
    def can_draft(self) -> bool:
        """Whether it can draft for the target."""
        return self.why_not is None

    @property
    def protocol(self) -> str:
        """``compatible``, or the mismatch."""
        if self.protocol_version == PROTOCOL_VERSION:
            return "compatible"
        return f"v{self.protocol_version}, need v{PROTOCOL_VERSION}"

    def fingerprint_match(self, fingerprint: str) -> bool:
        """Whether it shares the target's vocabulary."""
        return self.fingerprint == fingerprint


async def check(
    advert: WorkerAdvert,
    fingerprint: str,
    target_name: str,
    credentials: Credentials,
    timeout: float = HELLO_TIMEOUT_S,
) -> WorkerCheck:
    """Contact ``advert``'s worker with a Hello carrying the token, and check it can draft for the target."""
    if not advert.addresses:
        return _unanswered(advert, UNREACHABLE, "advertises no IPv4 address")
    try:
        connection = await connect(advert.address, credentials, timeout)
    except AuthenticationError as err:
        return _unanswered(advert, TOKEN_UNPROVEN, str(err))
    except RemoteWorkerError as err:
        if err.code not in _REFUSED:
            return _unanswered(advert, UNREACHABLE, str(err))
        sent_none = " (this machine sent no token: --insecure)" if credentials.token is None else ""
        return _unanswered(advert, TOKEN_REJECTED, f"{err}{sent_none}")
    try:
        return _answered(advert, connection, fingerprint, target_name)
    finally:
        await connection.close()


def _answered(
    advert: WorkerAdvert, connection: WorkerConnection, fingerprint: str, target_name: str
) -> WorkerCheck:
    hello = connection.hello
    try:
        check_hello(connection, fingerprint, target_name, BACKEND_STREAM)
        why_not = None
    except SpecwireError as err:
        why_not = str(err)
    return WorkerCheck(
        advert,
        True,
        hello.model.spec,
        hello.model.fingerprint,
        hello.protocol_version,
        TOKEN_ACCEPTED,
        why_not,
        hello.draft_tokens_per_second,
    )


def _unanswered(advert: WorkerAdvert, token: str, why_not: str) -> WorkerCheck:
    return WorkerCheck(
        advert,
        False,
        advert.model,
        advert.fingerprint,
        advert.protocol_version,
        token,
        why_not,
        advert.draft_tps,
    )


async def survey(
    adverts: list[WorkerAdvert],
    fingerprint: str,
    target_name: str,
    credentials: Credentials,
    timeout: float = HELLO_TIMEOUT_S,
) -> list[WorkerCheck]:
    """Every worker in ``adverts`` contacted at once and checked, in the order given."""
    checks: list[WorkerCheck | None] = [None] * len(adverts)

    async def one(i: int) -> None:
        checks[i] = await check(adverts[i], fingerprint, target_name, credentials, timeout)

    async with anyio.create_task_group() as tg:
        for i in range(len(adverts)):
            tg.start_soon(one, i)
    return [c for c in checks if c is not None]

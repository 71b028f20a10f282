"""How the coordinator proves the shared token, and reaches workers over plain TCP or TLS.

Every call carries a fresh ``x-specwire-auth`` proof (the token itself is
never sent). ``connect`` then checks the worker's Hello
proof, so a worker that cannot show the token (a spoofed advertisement, or a
different token) is never used. ``--insecure`` turns both off; ``--tls-ca``
connects over TLS and verifies the worker's certificate.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import grpc

from specwire.errors import InvalidArgumentError
from specwire.wire.auth import AUTH_METADATA, caller_proof, find_token

MAX_RECEIVE_BYTES = 64 << 20
CHANNEL_OPTIONS = [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.max_receive_message_length", MAX_RECEIVE_BYTES),
]


@dataclass(frozen=True)
class Credentials:
    """The coordinator's token (None when it has none) and TLS root, or insecure mode."""

    token: str | None = None
    tls_ca: bytes | None = None
    insecure: bool = False

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Credentials:
        """From --token-file, --tls-ca and --insecure (and $SPECWIRE_TOKEN, and the config dir)."""
        ca = None
        if getattr(args, "tls_ca", None) is not None:
            try:
                ca = args.tls_ca.read_bytes()
            except OSError as err:
                raise InvalidArgumentError(f"cannot read --tls-ca {args.tls_ca}: {err.strerror}") from err
        insecure = bool(getattr(args, "insecure", False))
        token = None if insecure else find_token(getattr(args, "token_file", None))
        return cls(token=token, tls_ca=ca, insecure=insecure)

    def channel(self, address: str) -> grpc.aio.Channel:
        """A channel to ``address``, over TLS when a CA is given."""
        if self.tls_ca is not None:
            creds = grpc.ssl_channel_credentials(root_certificates=self.tls_ca)
            return grpc.aio.secure_channel(address, creds, options=CHANNEL_OPTIONS)
        return grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)

    def metadata(self, method: str) -> list[tuple[str, str]] | None:
        """The call metadata proving the token for one call of ``method`` (None without a token).

        Passed explicitly on each call rather than by an interceptor: gRPC's
        intercepted streaming calls queue every message through an extra task.
        """
        return [(AUTH_METADATA, caller_proof(self.token, method))] if self.token else None

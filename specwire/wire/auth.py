"""The shared token: where it lives, and the proofs both sides exchange instead of the token.

A worker requires a shared token by default. The token itself never crosses
the network: every call carries a fresh proof,

    v1:<unix seconds>:<random nonce>:<HMAC-SHA256(token, "<seconds>:<nonce>:<method>")>

which the worker checks (right token, bound to this method, within five
minutes, nonce not seen before), and the worker answers Hello with
HMAC(token, "worker:" + the caller's proof), so a coordinator can tell a
worker that holds the token from a spoofed Bonjour advertisement before it
sends anything else. Without TLS a machine that can intercept the traffic
can still read and alter sessions; see docs/security.md.

Token lookup, in order: ``--token-file``, the ``SPECWIRE_TOKEN`` environment
variable, then ``token`` in the user's config directory, which a worker
creates (mode 0600) on first start when none of the others is given, and
``worker token`` / ``coordinator token`` show and set
(``specwire.wire.token_command``): every Mac of a set-up holds the same one.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import sys
import threading
import time
from pathlib import Path

from specwire.errors import AuthenticationError

TOKEN_ENV = "SPECWIRE_TOKEN"
AUTH_METADATA = "x-specwire-auth"
FRESHNESS_S = 300
ECHO_METHOD = "/specwire.echo"
_VERSION = "v1"


def config_dir() -> Path:
    """The user's config directory for specwire (XDG on Linux, Application Support on macOS)."""
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Application Support" / "specwire"
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "specwire"


def default_token_path() -> Path:
    """Where a worker creates its token, and where a coordinator on the same machine finds it."""
    return config_dir() / "token"


def read_token(path: Path) -> str:
    """The token in ``path`` (surrounding whitespace removed)."""
    try:
        token = path.read_text().strip()
    except OSError as err:
        raise AuthenticationError(f"cannot read token file {path}: {err.strerror}") from err
    if len(token) < 16:
        raise AuthenticationError(f"token in {path} is shorter than 16 characters")
    return token


def find_token(token_file: Path | None) -> str | None:
    """The token from ``--token-file``, ``SPECWIRE_TOKEN``, or the default file; None if there is none."""
    if token_file is not None:
        return read_token(token_file)
    if os.environ.get(TOKEN_ENV):
        return os.environ[TOKEN_ENV].strip()
    path = default_token_path()
    return read_token(path) if path.exists() else None


def create_token(path: Path) -> str:
    """Create a new random token at ``path`` with mode 0600 (the directory too, 0700)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    # Hex, never URL-safe base64: a token beginning with "-" read as an option where a user pastes it
    # (`worker token set TOKEN`), about one token in 64 (it failed the README's own steps in a test run).
    token = secrets.token_hex(32)
    staged = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    try:
        os.link(staged, path)  # appears whole, or not at all
    except FileExistsError:  # another worker on this machine created it first
        return read_token(path)
    finally:
        staged.unlink(missing_ok=True)
    return token


def write_token(path: Path, token: str) -> None:
    """Keep ``token`` at ``path`` with mode 0600 (the directory too, 0700), replacing what was there."""
    if len(token) < 16:
        raise AuthenticationError("a token is at least 16 characters; copy it whole (`token show` prints it)")
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    staged = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    os.replace(staged, path)


def _mac(token: str, message: str) -> str:
    return hmac.new(token.encode(), message.encode(), hashlib.sha256).hexdigest()


def caller_proof(token: str, method: str) -> str:
    """A fresh proof of the token for one call of ``method``."""
    now, nonce = int(time.time()), secrets.token_hex(12)
    return f"{_VERSION}:{now}:{nonce}:{_mac(token, f'{now}:{nonce}:{method}')}"


def worker_proof(token: str, caller: str) -> str:
    """The worker's answer to a caller's proof: it holds the token too."""
    return _mac(token, f"worker:{caller}")


def check_worker_proof(token: str, caller: str, proof: str) -> bool:
    """True when ``proof`` shows the worker holds ``token``."""
    return hmac.compare_digest(worker_proof(token, caller), proof)


class ProofChecker:
    """Checks callers' proofs on a worker, remembering nonces to refuse replays."""

    def __init__(self, token: str) -> None:
        self.token = token
        self._seen: dict[str, float] = {}
        self._lock = threading.Lock()

    def check(self, proof: str | None, method: str) -> None:
        """Raise ``AuthenticationError`` saying why, unless ``proof`` is valid for ``method``."""
        if not proof:
            raise AuthenticationError("no token proof: this worker requires the shared token")
        parts = proof.split(":")
        if len(parts) != 4 or parts[0] != _VERSION:
            raise AuthenticationError("malformed token proof")
        _, stamp, nonce, mac = parts
        try:
            age = abs(time.time() - int(stamp))
        except ValueError as err:
            raise AuthenticationError("malformed token proof") from err
        if not hmac.compare_digest(_mac(self.token, f"{stamp}:{nonce}:{method}"), mac):
            raise AuthenticationError("wrong token")
        if age > FRESHNESS_S:
            raise AuthenticationError(
                f"token proof is {age:.0f} s old (clocks more than {FRESHNESS_S} s apart?)"
            )
        with self._lock:
            now = time.time()
            if nonce in self._seen:
                raise AuthenticationError("token proof replayed")
            self._seen[nonce] = now
            if len(self._seen) > 10_000:
                self._seen = {n: t for n, t in self._seen.items() if now - t < 2 * FRESHNESS_S}

"""Command-line processes for the tests, forked from a process that has already imported mlx-lm.

Every ``worker`` and ``coordinator`` process a test starts pays for importing
mlx-lm, which imports transformers, which reads its 1,667 model files at
import: 1-4 s of CPU on the 2-core VM, in about 250 processes a run. A
zygote (the pattern of Android's app launcher and of multiprocessing's
forkserver) pays it once per test process: it imports the heavy libraries,
then forks a child for each command line and runs the command's module in
it as ``python -m`` would (``runpy``), with the caller's argv, environment,
working directory and standard streams (passed over a Unix socket).

The children are real processes running the real command: their own pid,
sockets, signals and exit status. What they skip is the interpreter's start
and the imports the zygote did. ``ZygoteProcess`` gives the caller what
``subprocess.Popen`` does (``poll``, ``wait``, ``send_signal``, ``kill``,
``communicate``, the pipes); the zygote reports each child's exit status.

Only ``[sys.executable, "-m", MODULE, ...]`` runs this way, and only when
the environment asks nothing the zygote's imports already fixed (variables
that mlx, transformers, Hugging Face or Python read at import must equal the
zygote's); anything else, and any platform without ``socket.send_fds``,
starts a plain subprocess (``popen``). Tests of how a command starts (the
README's commands, the entry points) use plain subprocesses.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

PRELOAD = ("numpy", "mlx.core", "mlx.nn", "mlx_lm", "grpc", "grpc.aio")
# The commands' modules: what they import is preloaded too (0.6 s of CPU a child on the 2-core VM), and
# they are then forgotten, so that each child runs its command's module afresh, as ``python -m`` would.
# The project's modules read the environment when called, never at import, so a child's own still counts.
COMMANDS = ("coordinator.cli", "worker.cli")
LATER = ("worker.server.server",)  # what ``worker serve`` imports once it runs (0.17 s of CPU)
# The default model's tokenizer, which ``tiny`` and ``default`` load with (0.6-0.8 s of CPU to build): built
# once here, every child finds it in the loader's per-process cache (keyed by the file's path, size and
# mtime, so a changed or other file is built afresh). Building one is tested in the test processes.
TOKENIZERS = ("default",)
# Variables read at import by what PRELOAD imports (or by the interpreter): a child asking other values
# than the zygote's gets a plain subprocess.
IMPORT_TIME_ENV = (
    "HF_",
    "HUGGINGFACE",
    "TRANSFORMERS",
    "TOKENIZERS",
    "MLX",
    "PYTHON",
    "GRPC_",
    "LC_",
    "LANG",
)
_HEADER = struct.Struct("!I")


# ---------------------------------------------------------------------------------------------------------
# The zygote: python -m tests.support.processes.zygote SOCKET


def _serve(path: str) -> None:
    """Import PRELOAD, then fork a child per request on the Unix socket at ``path`` until stdin closes."""
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    for name in COMMANDS:
        importlib.import_module(name)
        del sys.modules[name]
    for name in LATER:
        importlib.import_module(name)
    from specwire.models.loading import load_tokenizer

    for spec in TOKENIZERS:
        load_tokenizer(spec)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    wake_r, wake_w = socket.socketpair()
    wake_w.setblocking(False)
    signal.set_wakeup_fd(wake_w.fileno())
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children: dict[int, socket.socket] = {}
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    selector.register(wake_r, selectors.EVENT_READ, "reap")
    selector.register(sys.stdin, selectors.EVENT_READ, "parent")
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while True:
        for key, _ in selector.select():
            if key.data == "parent":  # the test process is gone: so are its children
                for pid in children:
                    _kill_quietly(pid)
                return
            if key.data == "reap":
                wake_r.recv(4096)
                _reap(children)
                continue
            conn, _ = listener.accept()
            try:
                request, fds = _receive(conn)
            except (OSError, ValueError):
                conn.close()
                continue
            pid = os.fork()
            if pid == 0:  # the child never returns from here
                selector.close()
                for s in (listener, wake_r, wake_w, *children.values()):
                    s.close()
                _child(conn, request, fds)
            for fd in fds:
                os.close(fd)
            conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
            children[pid] = conn
        _reap(children)


def _reap(children: dict[int, socket.socket]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
            conn.close()


def _kill_quietly(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _child(conn: socket.socket, request: dict[str, Any], fds: list[int]) -> None:
    """In the forked child: become ``python -m MODULE ARGS`` with the caller's streams, env and cwd."""
    code = 1
    try:
        conn.close()
        signal.set_wakeup_fd(-1)
        for sig in (
            signal.SIGCHLD,
            signal.SIGTERM,
            signal.SIGHUP,
        ):  # SIGPIPE stays ignored, as python sets it
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        sys.path[0] = request["cwd"]
        code = _run_module(request["module"], request["args"])
    finally:
        os._exit(code)


def _run_module(module: str, args: list[str]) -> int:
    """Run ``module`` as ``__main__`` as the interpreter would, and return the exit code it leaves."""
    import runpy

    sys.argv = [module, *args]
    code = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
        if not isinstance(done.code, int | None):
            print(done.code, file=sys.stderr)
    except KeyboardInterrupt:
        import traceback

        traceback.print_exc()
        _shutdown()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)  # the status an interrupted python exits with
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    _shutdown()
    return code


def _shutdown() -> None:
    """What the interpreter does at exit: wait for non-daemon threads, run atexit, flush the streams."""
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()


def _receive(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    header, fds, _, _ = socket.recv_fds(conn, _HEADER.size, 3)
    if len(header) != _HEADER.size:
        raise ValueError("short header")
    (size,) = _HEADER.unpack(header)
    body = b""
    while len(body) < size:
        chunk = conn.recv(size - len(body))
        if not chunk:
            raise ValueError("short request")
        body += chunk
    return json.loads(body), list(fds)


# ---------------------------------------------------------------------------------------------------------
# The caller's side


class ZygoteProcess:
    """A child of the zygote, with ``subprocess.Popen``'s interface for what the tests use."""

    def __init__(
        self,
        args: list[str],
        module: str,
        env: dict[str, str],
        cwd: str,
        stdin: Any,
        stdout: Any,
        stderr: Any,
    ) -> None:
        self.args = args
        self.returncode: int | None = None
        own: list[int] = []  # the child's ends, closed here once passed
        ours: list[tuple[int, str] | None] = []
        for target, spec in enumerate((stdin, stdout, stderr)):
            reading = target > 0
            if spec == subprocess.PIPE:
                r, w = os.pipe()
                child_end, our_end = (w, r) if reading else (r, w)
                own.append(child_end)
                ours.append((our_end, "r" if reading else "w"))
            else:  # DEVNULL, or None: this process's own stream
                own.append(os.open(os.devnull, os.O_RDWR) if spec == subprocess.DEVNULL else os.dup(target))
                ours.append(None)
        request = {"module": module, "args": args[3:], "env": env, "cwd": cwd}
        body = json.dumps(request).encode()
        self._conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._conn.connect(_zygote().path)
            socket.send_fds(self._conn, [_HEADER.pack(len(body))], own)
            self._conn.sendall(body)
        finally:
            for fd in own:
                os.close(fd)
        self._reader = self._conn.makefile("rb", buffering=0)  # unbuffered: select() sees the status line
        self.pid = int(json.loads(self._reader.readline())["pid"])
        streams = [None if end is None else open(*end, encoding="utf-8") for end in ours]  # noqa: SIM115
        self.stdin, self.stdout, self.stderr = streams

    def poll(self) -> int | None:
        """The exit code, if the child has exited."""
        if self.returncode is None:
            ready = selectors.DefaultSelector()
            ready.register(self._conn, selectors.EVENT_READ)
            if ready.select(0):
                self._read_status()
            ready.close()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the child to exit; ``subprocess.TimeoutExpired`` after ``timeout`` seconds."""
        if self.returncode is None:
            ready = selectors.DefaultSelector()
            ready.register(self._conn, selectors.EVENT_READ)
            found = ready.select(timeout)
            ready.close()
            if not found:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            self._read_status()
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, input: str | bytes | None = None, timeout: float | None = None) -> tuple[Any, Any]:
        """Send ``input``, read both pipes to their end and wait, as ``Popen.communicate`` does."""
        deadline = None if timeout is None else time.monotonic() + timeout
        results: dict[str, Any] = {}
        readers = [
            threading.Thread(target=lambda n=name, s=stream: results.__setitem__(n, s.read()), daemon=True)
            for name, stream in (("out", self.stdout), ("err", self.stderr))
            if stream is not None
        ]
        for reader in readers:
            reader.start()
        if self.stdin is not None:
            try:
                if input:
                    self.stdin.write(input)
                self.stdin.close()
            except BrokenPipeError:
                pass
        for reader in readers:
            reader.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return results.get("out"), results.get("err")

    def _read_status(self) -> None:
        line = self._reader.readline()
        self.returncode = int(json.loads(line)["returncode"]) if line else -signal.SIGKILL
        self._reader.close()
        self._conn.close()


class _Zygote:
    """The running zygote of this test process (one per process: it shares the process's namespace)."""

    def __init__(self) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="specwire-zygote-")
        self.path = os.path.join(self._dir.name, "socket")
        self.env = dict(os.environ)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.processes.zygote", self.path],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            cwd=_ROOT,
        )
        assert self.process.stdout is not None
        if self.process.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the test zygote did not start (exit {self.process.wait()})")
        atexit.register(self.close)

    def close(self) -> None:
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.close()  # the zygote kills its children and exits
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self._dir.cleanup()


_ROOT = str(Path(__file__).resolve().parents[3])
_started: _Zygote | None = None
_lock = threading.Lock()


def _zygote() -> _Zygote:
    global _started
    with _lock:
        if _started is None or _started.process.poll() is not None:
            _started = _Zygote()
        return _started


def _forkable(args: list[str], env: dict[str, str]) -> str | None:
    """The module of a ``python -m MODULE`` command line the zygote can run, else None."""
    if os.environ.get("SPECWIRE_TEST_NO_ZYGOTE") or not hasattr(socket, "send_fds"):
        return None
    if len(args) < 3 or args[0] != sys.executable or args[1] != "-m" or args[2].startswith("-"):
        return None
    base = os.environ if _started is None else _started.env
    for key in set(env) | set(base):
        if key.startswith(IMPORT_TIME_ENV) and env.get(key) != base.get(key):
            return None
    return args[2]


def popen(args: list[str], *, env: dict[str, str] | None = None, stdin: Any = None) -> Any:
    """``subprocess.Popen(args, stdin=stdin, stdout=PIPE, stderr=PIPE, text=True)``, forked from the
    zygote where it can be (module docstring)."""
    env = dict(os.environ if env is None else env)
    pipe = subprocess.PIPE
    module = _forkable(args, env)
    if module is None:
        return subprocess.Popen(args, env=env, stdin=stdin, stdout=pipe, stderr=pipe, text=True)
    return ZygoteProcess(args, module, env, os.getcwd(), stdin, pipe, pipe)


def run(
    args: list[str], *, input: str | None = None, timeout: float | None = None
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(args, capture_output=True, text=True)``, forked from the zygote where it can be."""
    process = popen(args, stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL)
    try:
        out, err = process.communicate(input, timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise
    return subprocess.CompletedProcess(args, process.returncode, out, err)


if __name__ == "__main__":
    _serve(sys.argv[1])

"""What runs inside an engine's confinement, between the sandbox and the engine.

Run as a script, never imported by the worker (``python -I -S jail.py [--landlock RULES]
[--forward PORT=SOCKET[@HOST:PORT]]... -- ARGV...``), so it imports only the standard
library and works with nothing but the interpreter's own prefix readable. It:

1. with ``--landlock RULES`` (a JSON object: ``read``, ``write`` paths, ``connect`` TCP
   ports), restricts itself with Landlock (``PR_SET_NO_NEW_PRIVS``, a ruleset, then
   ``landlock_restrict_self``) and execs the engine: every descendant inherits the domain;
2. with ``--forward`` (under bubblewrap, in the sandbox's own network namespace), listens on
   ``127.0.0.1:PORT`` and carries each connection to the unix ``SOCKET`` vibey's allow-list
   proxy listens on, outside the sandbox: as it is (the engine's ``HTTPS_PROXY``), or after a
   ``CONNECT HOST:PORT`` (an allowed loopback endpoint, reached at its own address inside);
   then runs the engine as its child, passes SIGTERM/SIGINT/SIGHUP on to it, and exits as it
   did (the same status, or the same signal).

The checks are the proxy's: this script only carries bytes, so a forward can reach nothing
the proxy refuses.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

# Landlock (include/uapi/linux/landlock.h); the syscall numbers are the same on every arch.
CREATE_RULESET, ADD_RULE, RESTRICT_SELF = 444, 445, 446
CREATE_RULESET_VERSION = 1
RULE_PATH_BENEATH, RULE_NET_PORT = 1, 2
PR_SET_NO_NEW_PRIVS = 38
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_ALL_V1 = (1 << 13) - 1  # EXECUTE .. MAKE_SYM
FS_REFER, FS_TRUNCATE, FS_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
NET_CONNECT_TCP = 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1
FILE_ONLY = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
CHUNK = 65536


class _Ruleset(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _NetPort(ctypes.Structure):
    _fields_ = [("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64)]


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 when it has none (or it is disabled)."""
    libc = _libc()
    abi = libc.syscall(CREATE_RULESET, None, ctypes.c_size_t(0), CREATE_RULESET_VERSION)
    return max(0, int(abi))


def _handled_fs(abi: int) -> int:
    handled = FS_ALL_V1
    if abi >= 2:
        handled |= FS_REFER
    if abi >= 3:
        handled |= FS_TRUNCATE
    if abi >= 5:
        handled |= FS_IOCTL_DEV
    return handled


def restrict(
    read: list[str],
    write: list[str],
    connect: list[int],
    devices: Sequence[str] = (),
) -> None:
    """Confines this process and its future children: ``read`` paths readable and
    executable, ``write`` paths wholly usable, ``devices`` readable and writable (no new
    files), nothing else of the filesystem; with ABI 4 or
    later TCP connects only to ``connect`` ports; with ABI 6 or later no signal or abstract
    unix socket outside the domain. Raises OSError when the kernel refuses."""
    libc = _libc()
    abi = landlock_abi()
    if abi < 1:
        raise OSError("Landlock is not available in this kernel")
    handled = _handled_fs(abi)
    attr = _Ruleset(handled, NET_CONNECT_TCP if abi >= 4 else 0)
    size = 8 if abi < 4 else (16 if abi < 6 else 24)
    if abi >= 6:
        attr.scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL
    fd = libc.syscall(CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), 0)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
    readable = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
    try:
        device = FS_READ_FILE | FS_WRITE_FILE | FS_READ_DIR | (FS_IOCTL_DEV if abi >= 5 else 0)
        for paths, access in ((read, readable), (write, handled), (devices, device)):
            for path in paths:
                _add_path(libc, fd, path, access)
        for port in connect if abi >= 4 else []:
            _add_port(libc, fd, port)
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
        if libc.syscall(RESTRICT_SELF, fd, 0) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    finally:
        os.close(fd)


def _add_port(libc: ctypes.CDLL, ruleset: int, port: int) -> None:
    rule = _NetPort(NET_CONNECT_TCP, port)
    if libc.syscall(ADD_RULE, ruleset, RULE_NET_PORT, ctypes.byref(rule), 0) != 0:
        raise OSError(ctypes.get_errno(), f"landlock_add_rule port {port}")


def _add_path(libc: ctypes.CDLL, ruleset: int, path: str, access: int) -> None:
    try:
        target = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return  # a path that does not exist grants nothing
    try:
        if not os.path.isdir(path):
            access &= FILE_ONLY
        rule = _PathBeneath(access, target)
        if libc.syscall(ADD_RULE, ruleset, RULE_PATH_BENEATH, ctypes.byref(rule), 0) != 0:
            raise OSError(ctypes.get_errno(), f"landlock_add_rule {path}")
    finally:
        os.close(target)


# -- forwards: a loopback port inside, the proxy's unix socket outside ----------------------


def _splice(a: socket.socket, b: socket.socket) -> None:
    """Carries bytes both ways until either side closes."""
    with selectors.DefaultSelector() as sel, a, b:
        sel.register(a, selectors.EVENT_READ, b)
        sel.register(b, selectors.EVENT_READ, a)
        while True:
            for key, _ in sel.select():
                source, sink = key.fileobj, key.data
                assert isinstance(source, socket.socket)
                try:
                    data = source.recv(CHUNK)
                    if not data:
                        return
                    sink.sendall(data)
                except OSError:
                    return


def _tunnel(sock_path: str, target: str | None) -> socket.socket:
    """A connection to the proxy, through a CONNECT to ``target`` when one is given."""
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    upstream.connect(sock_path)
    if target is None:
        return upstream
    upstream.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = upstream.recv(1)
        if not chunk:
            break
        head += chunk
    if head.split(b" ", 2)[1:2] != [b"200"]:
        upstream.close()
        raise OSError(f"the proxy refused {target}")
    return upstream


def _serve(listener: socket.socket, sock_path: str, target: str | None) -> None:
    while True:
        client, _ = listener.accept()
        threading.Thread(target=_carry, args=(client, sock_path, target), daemon=True).start()


def _carry(client: socket.socket, sock_path: str, target: str | None) -> None:
    try:
        upstream = _tunnel(sock_path, target)
    except OSError:
        client.close()
        return
    _splice(client, upstream)


def forward(spec: str) -> None:
    """Starts the forward ``PORT=SOCKET[@HOST:PORT]`` in a daemon thread."""
    port, _, rest = spec.partition("=")
    sock_path, _, target = rest.partition("@")
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(("127.0.0.1", int(port)))
    except OSError as exc:  # a port below 1024 needs a capability the sandbox dropped
        print(f"vibey: no forward of 127.0.0.1:{port} in the sandbox ({exc})", file=sys.stderr)
        listener.close()
        return
    listener.listen(64)
    args = (listener, sock_path, target or None)
    threading.Thread(target=_serve, args=args, daemon=True).start()


# -- the engine -----------------------------------------------------------------------------


def _exit_as(returncode: int) -> None:
    if returncode < 0:
        if -returncode not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-returncode, signal.SIG_DFL)
        os.kill(os.getpid(), -returncode)
        time.sleep(1)
    sys.exit(returncode if returncode >= 0 else 128 - returncode)


def _run_child(argv: list[str]) -> None:
    try:
        engine = subprocess.Popen(argv)
    except OSError as exc:
        sys.exit(f"vibey: cannot start {argv[0]}: {exc}")

    def pass_on(signum: int, frame: object) -> None:
        with contextlib.suppress(OSError):
            engine.send_signal(signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, pass_on)
    _exit_as(engine.wait())


def main(args: list[str]) -> None:
    if "--" not in args:
        sys.exit("usage: jail.py [--landlock RULES] [--forward PORT=SOCKET[@HOST:PORT]] -- ARGV")
    split = args.index("--")
    options, argv = args[:split], args[split + 1 :]
    rules, forwards = None, []
    for flag, value in zip(options[::2], options[1::2], strict=True):
        if flag == "--landlock":
            rules = json.loads(value)
        elif flag == "--forward":
            forwards.append(value)
        else:
            sys.exit(f"jail.py: unknown option {flag}")
    if rules is not None:
        try:
            restrict(rules["read"], rules["write"], rules["connect"], rules.get("devices", []))
        except OSError as exc:
            sys.exit(f"vibey: cannot confine the engine with Landlock: {exc}")
    if not forwards:
        try:
            os.execvp(argv[0], argv)
        except OSError as exc:
            sys.exit(f"vibey: cannot start {argv[0]}: {exc}")
    for spec in forwards:
        forward(spec)
    _run_child(argv)


if __name__ == "__main__":
    main(sys.argv[1:])

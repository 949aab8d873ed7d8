"""Confining an engine run: its own worktree to write, what it needs to read, its model API.

Every engine process (a CLI run by the worker, by a loop service, a ``command`` engine, a
conformance check) starts through :func:`actors.agents.process.run_supervised`, which, given a
:class:`Confinement`, runs the engine inside it (:meth:`Confinement.enter`):

- **bubblewrap** (``bwrap``, where user namespaces are allowed): a new mount, PID, network,
  IPC, UTS and cgroup namespace. The filesystem is built from nothing: the system read-only
  (``/usr``, ``/etc``, ``/opt``, the ``/lib`` and ``/bin`` links), the engine's binary and
  runtime read-only (its install prefix, the interpreter its ``#!`` line names and that
  one's prefix: a node or a Python venv), ``read_allow``; writable: the run's directory
  (the worktree, the project's git directory it needs to commit, a command engine's run
  directory), a HOME of its own that vibey keeps outside every worktree
  (``<state>/homes/<engine>/<project>``), the CLI's state directories its ``env`` names
  (``GEMINI_CLI_HOME``, ``CODEX_HOME``, … :func:`state_dirs`), ``write_allow``, and a
  private ``/tmp``. Nothing
  else exists inside: other projects' worktrees, the operator's home, ``/run`` (and the
  database's socket there) are absent, and ``/proc`` shows only the sandbox's processes.
  The network namespace has only its own loopback: vibey's allow-list proxy
  (:class:`AllowProxy`, outside) listens on a unix socket bind-mounted into the sandbox, and
  :mod:`actors.agents.jail` bridges it to ``127.0.0.1:PROXY_PORT`` inside (the engine's
  ``HTTPS_PROXY``/``HTTP_PROXY``) and each allowed loopback endpoint to its own address.
- **Landlock** (otherwise, where the kernel has it): the same read and write sets as a
  Landlock domain (nothing else of the filesystem, no ptrace or signal outside it: another
  process's ``/proc/<pid>/environ`` is refused), TCP connects only to the proxy's loopback
  port and the allowed loopback ports (ABI 4: ports, not hosts; HTTP(S) goes through the
  proxy, which checks the host). No private ``/tmp``: ``TMPDIR`` is a directory of the run.
- **none**: off by setting (a WARNING at each run), or unavailable (``auto`` found neither).
  An explicit ``bwrap`` or ``landlock`` that is unavailable fails the run instead.

The proxy allows exactly ``network_allow`` (``host:port``; default: the adapter's model API
host and the ``host:port`` of each ``*_BASE_URL``/``*_API_BASE`` variable of the engine's
``env``), answers ``CONNECT host:port`` and absolute-form HTTP requests, and refuses every
other destination with a 403 and a WARNING naming it.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import re
import selectors
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

MODES: tuple[str, ...] = ("auto", "bwrap", "landlock", "none")
JAIL = Path(__file__).with_name("jail.py")
PROXY_PORT = 3128
INSIDE_SOCKET = "/run/vibey/proxy.sock"
SYSTEM_READ: tuple[str, ...] = ("/usr", "/etc", "/opt")
SYSTEM_LINKS: tuple[str, ...] = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
LANDLOCK_READ: tuple[str, ...] = (*SYSTEM_READ, *SYSTEM_LINKS, "/proc", "/sys")
_BASE_URL = re.compile(r".*_(BASE_URL|API_BASE|BASE|ENDPOINT|HOST)$")
_ENDPOINT = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):([0-9]{1,5})$")
LOOPBACK = frozenset({"127.0.0.1", "localhost", "[::1]"})
HEADER_LIMIT = 65536
log = logging.getLogger(__name__)


class ConfinementError(ValueError):
    """A confinement setting that cannot be used; the message names the fix."""


def check_endpoint(entry: str) -> str:
    """``entry`` as ``host:port`` (lower-cased host), or :class:`ConfinementError`."""
    match = _ENDPOINT.match(entry.strip())
    if match is None or not 1 <= int(match.group(2)) <= 65535:
        raise ConfinementError(f"network_allow entries are host:port (port 1-65535), got {entry!r}")
    return f"{match.group(1).lower()}:{int(match.group(2))}"


def env_endpoints(env: Mapping[str, str]) -> tuple[str, ...]:
    """The ``host:port`` of each base-URL variable of an engine's ``env``
    (``ANTHROPIC_BASE_URL``, ``OPENAI_BASE_URL``, ``OPENAI_API_BASE``, …): where its CLI is
    told its model API is."""
    found: list[str] = []
    for name, value in sorted(env.items()):
        if not _BASE_URL.match(name.upper()):
            continue
        parts = urlsplit(value.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            continue
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            continue
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        found.append(f"{host.lower()}:{port}")
    return tuple(dict.fromkeys(found))


def config_endpoints(env: Mapping[str, str]) -> tuple[str, ...]:
    """The ``host:port`` of each ``base_url`` a CLI's own config names where its ``env`` says
    it is: Codex's ``$CODEX_HOME/config.toml`` ``[model_providers.<id>]`` tables."""
    import tomllib

    home = env.get("CODEX_HOME")
    if not home:
        return ()
    try:
        config = tomllib.loads((Path(home) / "config.toml").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ()
    providers = config.get("model_providers")
    if not isinstance(providers, Mapping):
        return ()
    urls = {
        f"{name}_BASE_URL": str(table.get("base_url", ""))
        for name, table in providers.items()
        if isinstance(table, Mapping)
    }
    return env_endpoints(urls)


# -- what the machine offers ----------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def bwrap_problem() -> str | None:
    """Why bubblewrap cannot confine here (not installed, or user namespaces refused); None
    when it can. Asked once per process: a real sandbox that runs ``true``."""
    binary = shutil.which("bwrap")
    if binary is None:
        return "bwrap is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    probe = [binary, "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/"]
    try:
        done = subprocess.run(
            [*probe, "--proc", "/proc", "--dev", "/dev", "true"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap did not run ({exc})"
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        return f"bwrap cannot create namespaces here ({why})"
    return None


@functools.lru_cache(maxsize=1)
def landlock_problem() -> str | None:
    """Why Landlock cannot confine here; None when it can (ABI 1 or later)."""
    if not sys.platform.startswith("linux"):
        return "Landlock is Linux only"
    from actors.agents.jail import landlock_abi

    try:
        abi = landlock_abi()
    except (OSError, AttributeError) as exc:
        return f"Landlock could not be asked ({exc})"
    return None if abi >= 1 else "the kernel has no Landlock (or it is disabled)"


@dataclass(frozen=True, slots=True)
class Mechanism:
    """What confines an engine's runs: ``bwrap``, ``landlock`` or ``none`` (then ``why``);
    ``refused``: an explicit mode that is unavailable (a run fails rather than go
    unconfined)."""

    kind: str
    why: str = ""
    refused: bool = False

    def describe(self) -> str:
        if self.kind != "none":
            return self.kind
        return f"none ({self.why})"


def mechanism(mode: str) -> Mechanism:
    """What ``mode`` comes to on this machine (``auto``: bubblewrap, else Landlock)."""
    if mode == "none":
        return Mechanism("none", "off by setting")
    if mode in ("auto", "bwrap"):
        problem = bwrap_problem()
        if problem is None:
            return Mechanism("bwrap")
        if mode == "bwrap":
            return Mechanism("none", f"unavailable: {problem}", refused=True)
    problem_ll = landlock_problem()
    if problem_ll is None:
        return Mechanism("landlock")
    if mode == "landlock":
        return Mechanism("none", f"unavailable: {problem_ll}", refused=True)
    return Mechanism("none", f"unavailable: {bwrap_problem()}; {problem_ll}")


# -- the policy of one engine -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Confinement:
    """One engine's confinement settings (``[engines.<id>]``'s ``confinement``,
    ``network_allow``, ``read_allow``, ``write_allow``) and where its HOMEs are kept."""

    engine: str
    mode: str = "auto"
    network: tuple[str, ...] = ()
    read: tuple[str, ...] = ()
    write: tuple[str, ...] = ()
    homes: Path | None = None  # <state>/homes; None: a HOME of the run's own, discarded

    @property
    def mechanism(self) -> Mechanism:
        return mechanism(self.mode)

    def describe(self) -> str:
        """One line: what confines the runs and what they may reach on the network."""
        found = self.mechanism
        if found.kind == "none":
            return found.describe() + ("; the run is refused" if found.refused else "")
        allowed = ", ".join(self.network) or "nothing"
        return f"{found.kind}; network: {allowed}"

    def home(self, project: str | None) -> Path | None:
        if self.homes is None:
            return None
        return self.homes / _safe(self.engine) / _safe(project or "_")

    @contextlib.contextmanager
    def enter(
        self,
        argv: Sequence[str],
        *,
        cwd: Path,
        env: Mapping[str, str],
        project: str | None = None,
        run_dir: Path | None = None,
    ) -> Iterator[tuple[list[str], dict[str, str]]]:
        """The argv and environment that run ``argv`` confined in ``cwd``, valid while the
        block runs (the proxy serves it); :class:`ConfinementError` when the setting asks
        for a mechanism that is unavailable."""
        found = self.mechanism
        if found.refused:
            raise ConfinementError(
                f"engine {self.engine}: confinement = {self.mode!r} is {found.why}: install "
                'it, or set confinement = "auto" (or "none", unconfined) in '
                f"[engines.{self.engine}]"
            )
        if found.kind == "none":
            log.warning(
                "engine %s runs UNCONFINED (%s): it can read and write all the worker can, "
                "and reach any host",
                self.engine,
                found.why,
            )
            yield list(argv), dict(env)
            return
        with tempfile.TemporaryDirectory(prefix="vibey-jail-") as scratch:
            room = _Room(self, found.kind, Path(scratch), cwd, env, project, run_dir)
            with AllowProxy(self.engine, self.network, room.listen_at()) as proxy:
                yield room.argv(argv, proxy), room.environment(proxy)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name) or "_"


@dataclass
class _Room:
    """The paths and argv of one confined run."""

    policy: Confinement
    kind: str  # bwrap or landlock
    scratch: Path  # vibey's, outside the sandbox: the proxy's socket, a discarded HOME
    cwd: Path
    env: Mapping[str, str]
    project: str | None
    run_dir: Path | None
    home: Path = field(init=False)
    tmp: Path = field(init=False)

    def __post_init__(self) -> None:
        home = self.policy.home(self.project)
        self.home = home if home is not None else self.scratch / "home"
        self.home.mkdir(parents=True, exist_ok=True)
        self.tmp = self.scratch / "tmp"
        self.tmp.mkdir()

    def listen_at(self) -> Path | tuple[str, int]:
        return self.scratch / "proxy.sock" if self.kind == "bwrap" else ("127.0.0.1", 0)

    def reads(self, argv: Sequence[str]) -> list[Path]:
        found = [*runtime_paths(argv[0], self.env), *map(Path, self.policy.read)]
        found += _git_dirs(self.cwd)[1]
        found.append(JAIL)
        found += _python_paths()
        return _existing(found)

    def writes(self) -> list[Path]:
        for path in self.policy.write:  # a directory vibey is told to let it write
            with contextlib.suppress(OSError):
                Path(path).mkdir(parents=True, exist_ok=True)
        found = [self.cwd, *_git_dirs(self.cwd)[0], self.home, *map(Path, self.policy.write)]
        found += state_dirs(self.env)
        if self.run_dir is not None:
            found.append(self.run_dir)
        return _existing(found)

    def loopback_ports(self) -> list[tuple[int, str]]:
        """The allowed loopback endpoints: (port, host:port)."""
        ports = []
        for entry in self.policy.network:
            host, _, port = entry.rpartition(":")
            if host in LOOPBACK and int(port) != PROXY_PORT:
                ports.append((int(port), entry))
        return ports

    def argv(self, argv: Sequence[str], proxy: AllowProxy) -> list[str]:
        jail = [os.path.realpath(sys.executable), "-I", "-S", str(JAIL)]
        if self.kind == "landlock":
            rules = {
                "read": [*LANDLOCK_READ, *map(str, self.reads(argv))],
                "write": [*map(str, self.writes()), str(self.tmp)],
                "devices": ["/dev"],
                "connect": [proxy.port, *(p for p, _ in self.loopback_ports())],
            }
            return [*jail, "--landlock", json.dumps(rules), "--", *argv]
        forwards = [f"{PROXY_PORT}={INSIDE_SOCKET}"]
        forwards += [f"{p}={INSIDE_SOCKET}@{entry}" for p, entry in self.loopback_ports()]
        options = [item for spec in forwards for item in ("--forward", spec)]
        return [*self.bwrap(argv, proxy), "--", *jail, *options, "--", *argv]

    def bwrap(self, argv: Sequence[str], proxy: AllowProxy) -> list[str]:
        command = [shutil.which("bwrap") or "bwrap", "--unshare-all", "--die-with-parent"]
        command += ["--cap-drop", "ALL"]  # none, even in its own user namespace
        command += ["--proc", "/proc", "--dev", "/dev"]
        for link in SYSTEM_LINKS:
            if os.path.islink(link):
                command += ["--symlink", os.readlink(link), link]
        mounts: list[tuple[str, str]] = [("--tmpfs", "/tmp"), ("--tmpfs", "/var/tmp")]
        mounts += [("--ro-bind", d) for d in (*SYSTEM_READ, *SYSTEM_LINKS) if _real_dir(d)]
        mounts += [("--ro-bind", str(p)) for p in self.reads(argv)]
        mounts += [("--bind", str(p)) for p in self.writes()]
        mounts += [("--ro-bind", str(p)) for p in _git_dirs(self.cwd)[2]]
        mounts.sort(key=lambda m: (len(Path(m[1]).parts), m[0] != "--tmpfs"))
        for flag, path in dict((path, (flag, path)) for flag, path in mounts).values():
            command += [flag, path] if flag == "--tmpfs" else [flag, path, path]
        command += ["--bind", str(proxy.where), INSIDE_SOCKET, "--chdir", str(self.cwd)]
        return command

    def environment(self, proxy: AllowProxy) -> dict[str, str]:
        env = dict(self.env)
        inside = f"http://127.0.0.1:{PROXY_PORT if self.kind == 'bwrap' else proxy.port}"
        tmp = "/tmp" if self.kind == "bwrap" else str(self.tmp)
        loopback = "localhost,127.0.0.1,::1"
        env.update(HOME=str(self.home), TMPDIR=tmp, NO_PROXY=loopback, no_proxy=loopback)
        for name in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy", "ALL_PROXY"):
            env[name] = inside
        env["NODE_USE_ENV_PROXY"] = "1"  # node 24+: fetch honours HTTP(S)_PROXY
        return env


_STATE_VARIABLE = re.compile(r".+_(HOME|CONFIG_DIR|STATE_DIR|CACHE_DIR|DATA_DIR)$")


def state_dirs(env: Mapping[str, str]) -> list[Path]:
    """The CLI's own state directories its ``env`` names (``GEMINI_CLI_HOME``,
    ``CODEX_HOME``, ``CLAUDE_CONFIG_DIR``, …: an existing absolute directory, never ``/`` nor
    the operator's home or above it): writable, as its HOME is."""
    home = Path(os.path.expanduser("~"))
    found = []
    for name, value in sorted(env.items()):
        path = Path(value)
        if not _STATE_VARIABLE.match(name) or not path.is_absolute() or not path.is_dir():
            continue
        if path == Path("/") or path == home or path in home.parents:
            continue
        found.append(path)
    return found


def _real_dir(path: str) -> bool:
    return os.path.isdir(path) and not os.path.islink(path)


def _existing(paths: Sequence[Path]) -> list[Path]:
    found = [Path(os.path.abspath(p)) for p in paths if os.path.exists(p)]
    return list(dict.fromkeys(found))


def _python_paths() -> list[Path]:
    """What ``jail.py`` needs: the interpreter's own prefix when it is not the system's."""
    prefixes = {Path(sys.base_prefix), Path(os.path.realpath(sys.executable)).parent.parent}
    return [p for p in prefixes if not str(p).startswith("/usr")]


GIT_WRITABLE = ("objects", "refs", "logs")
GIT_KEPT = ("config", "hooks", "info")


def _git_dirs(cwd: Path) -> tuple[list[Path], list[Path], list[Path]]:
    """What of the repository behind ``cwd`` a run may write, read, and must not change.

    A worktree's ``.git`` file names its git directory (writable: its HEAD and index) and
    the repository's (read; writable only where commits go: ``objects``, ``refs``, ``logs``),
    so the engine can commit but cannot plant a hook or a ``core.fsmonitor`` that vibey's own
    git calls would run outside the confinement. A ``.git`` directory inside ``cwd`` keeps
    its ``config``, ``hooks`` and ``info`` read-only (bubblewrap; Landlock cannot narrow a
    directory it allows)."""
    dot = cwd / ".git"
    if dot.is_dir():
        return [], [], [dot / name for name in GIT_KEPT if (dot / name).exists()]
    if not dot.is_file():
        return [], [], []
    text = dot.read_text(errors="replace").strip()
    if not text.startswith("gitdir:"):
        return [], [], []
    gitdir = (cwd / text.removeprefix("gitdir:").strip()).resolve()
    common = gitdir / "commondir"
    if not common.is_file():
        return [gitdir], [], []
    repository = (gitdir / common.read_text().strip()).resolve()
    return [gitdir, *(repository / name for name in GIT_WRITABLE)], [repository], []


def runtime_paths(binary: str, env: Mapping[str, str]) -> list[Path]:
    """What running ``binary`` reads besides the system: its install prefix (the directory
    above its ``bin``, never one that holds a home or ``/``), the directory of the file it
    resolves to, and the same for the interpreter its ``#!`` line names (``env node`` is
    looked up on the engine's PATH)."""
    found: list[Path] = []
    path = shutil.which(binary, path=env.get("PATH")) or binary
    for candidate in (path, _interpreter(path, env)):
        if candidate is None:
            continue
        for form in (Path(os.path.abspath(candidate)), Path(os.path.realpath(candidate))):
            found.append(_prefix(form))
            found.append(form.parent)
    return found


def _prefix(path: Path) -> Path:
    if path.parent.name != "bin":
        return path.parent
    prefix = path.parent.parent
    home = Path(os.path.expanduser("~"))
    if prefix == Path("/") or prefix == home or prefix in home.parents:
        return path.parent
    return prefix if _installed_here(prefix) else path.parent


def _installed_here(prefix: Path) -> bool:
    """Whether ``prefix`` looks like an install prefix (a ``lib`` or ``node_modules`` beside
    its ``bin``, or a venv): a directory of other things keeps only its ``bin`` readable."""
    return any((prefix / name).exists() for name in ("lib", "node_modules", "pyvenv.cfg"))


def _interpreter(path: str, env: Mapping[str, str]) -> str | None:
    try:
        with open(path, "rb") as handle:
            first = handle.readline(512)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode(errors="replace").split()
    if not words:
        return None
    if os.path.basename(words[0]) == "env" and len(words) > 1:
        named = [w for w in words[1:] if not w.startswith("-")]
        return shutil.which(named[0], path=env.get("PATH")) if named else None
    return words[0]


# -- the allow-list proxy -------------------------------------------------------------------


class AllowProxy:
    """An HTTP proxy that reaches exactly ``allowed`` (``host:port``): ``CONNECT`` for TLS,
    absolute-form requests for plain HTTP; anything else gets a 403 and a WARNING. Listens on
    a unix socket (``where``, bwrap) or a loopback TCP port (``port``, Landlock) while it is
    entered; one thread per connection."""

    def __init__(self, engine: str, allowed: Sequence[str], where: Path | tuple[str, int]) -> None:
        self.engine = engine
        self.allowed = frozenset(allowed)
        self.where = where
        self.port = 0
        self.refused: list[str] = []
        self._listener: socket.socket | None = None

    def __enter__(self) -> AllowProxy:
        if isinstance(self.where, Path):
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(str(self.where))
        else:
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.bind(self.where)
            self.port = listener.getsockname()[1]
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._serve, name=f"proxy-{self.engine}", daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()

    def _serve(self) -> None:
        assert self._listener is not None
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(client,), daemon=True).start()

    def _handle(self, client: socket.socket) -> None:
        with client:
            try:
                self._answer(client)
            except OSError:  # the engine hung up (a broken pipe): there is no one to answer
                return

    def _answer(self, client: socket.socket) -> None:
        head = _read_head(client)
        if head is None:
            return
        target, rewritten = _destination(head)
        if target is None or target not in self.allowed:
            shown = target or head.split(b"\r\n", 1)[0][:120].decode(errors="replace")
            self.refused.append(shown)
            log.warning(
                "engine %s tried to reach %s: not in its network_allow (%s); refused",
                self.engine,
                shown,
                ", ".join(sorted(self.allowed)) or "nothing",
            )
            body = f"vibey: {shown} is not in network_allow of engine {self.engine}\n"
            client.sendall(_response(403, "Forbidden", body))
            return
        host, _, port = target.rpartition(":")
        try:
            upstream = socket.create_connection((host.strip("[]"), int(port)), timeout=15)
        except OSError as exc:
            client.sendall(_response(502, "Bad Gateway", f"vibey: {target}: {exc}\n"))
            return
        with upstream:
            upstream.settimeout(None)
            if rewritten is None:
                client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                upstream.sendall(rewritten)
            _splice(client, upstream)


def _read_head(client: socket.socket) -> bytes | None:
    """The request's head and whatever of its body came with it (None: nothing sane)."""
    data = b""
    client.settimeout(30)
    while b"\r\n\r\n" not in data:
        try:
            chunk = client.recv(4096)
        except OSError:
            return None
        if not chunk or len(data) > HEADER_LIMIT:
            return None
        data += chunk
    client.settimeout(None)
    return data


def _destination(head: bytes) -> tuple[str | None, bytes | None]:
    """The ``host:port`` a request asks for and, for plain HTTP, the request rewritten to
    origin form (None for CONNECT)."""
    line, _, rest = head.partition(b"\r\n")
    words = line.decode("latin-1").split(" ")
    if len(words) != 3:
        return None, None
    method, target, version = words
    if method.upper() == "CONNECT":
        try:
            return check_endpoint(target), None
        except ConfinementError:
            return None, None
    parts = urlsplit(target)
    if parts.scheme != "http" or not parts.hostname:
        return None, None
    try:
        port = parts.port or 80
    except ValueError:
        return None, None
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    first = f"{method} {path} {version}".encode("latin-1")
    return f"{host.lower()}:{port}", first + b"\r\n" + rest


def _response(code: int, reason: str, body: str) -> bytes:
    data = body.encode()
    head = f"HTTP/1.1 {code} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {len(data)}"
    return (head + "\r\nConnection: close\r\n\r\n").encode() + data


def _splice(a: socket.socket, b: socket.socket) -> None:
    with selectors.DefaultSelector() as sel, b:
        sel.register(a, selectors.EVENT_READ, b)
        sel.register(b, selectors.EVENT_READ, a)
        while True:
            for key, _ in sel.select():
                source, sink = key.fileobj, key.data
                assert isinstance(source, socket.socket)
                try:
                    data = source.recv(65536)
                    if not data:
                        return
                    sink.sendall(data)
                except OSError:
                    return

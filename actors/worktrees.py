"""Git on disk for the BUILD phase: one repository per project, one worktree per work item.

Layout under the workspace root::

    <root>/<project>/repo                       the project's repository (branch main)
    <root>/<project>/worktrees/c<cycle>-<item>  a work item's worktree, branch vibey/c<cycle>/<item>
    <root>/<project>/worktrees/integration      the integration worktree, branch vibey/integration
    <root>/<project>/.vibey.lock                serialises changes to the repository's metadata
    <root>/<project>/held/c<cycle>-<item>.json  an item the merge queue's current pass holds out

Every call is idempotent: a retried build.implement reuses its worktree, and integrating
branches that are already merged is a no-op. Creating the repository and adding worktrees take
an exclusive ``flock`` on the project's lock file, so parallel implement jobs on one host (in
threads or processes) never race on git's own lock files. :meth:`Workspace.merge_queue` does
not serialise itself: its caller holds the per project and cycle lock (see ``actors.handlers``).

The merge queue (:mod:`workflows.merge_queue`): :meth:`Workspace.merge_queue` merges a cycle's
items one at a time, in the order given, and reports each one that conflicts (its files, and
the items already merged that changed them) instead of stopping there; :meth:`start_resolve`
merges the integration branch into a conflicting item's worktree, leaving the conflict for an
engine (or a person) to resolve, and :func:`finish_resolve` commits the resolution once no
conflict marker is left (:func:`abort_resolve` drops it).

Exceptions::

    WorkspaceError              a name that cannot be a path or a branch, or a git call failed
    ├── GitError                a git command exited non-zero (its arguments and stderr kept)
    ├── UnknownBranchError      integrate was asked for an item branch that does not exist
    ├── MergeConflictError      an item branch does not merge cleanly (internal: the merge
    │                           queue reports it as a conflict)
    └── UnresolvedError         a resolution left conflict markers, or did not merge
"""

from __future__ import annotations

import fcntl
import json
import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from workflows.merge_queue import Conflict, Pass, merge_pass

MAIN_BRANCH = "main"
INTEGRATION_BRANCH = "vibey/integration"
GIT_IDENTITY = "vibey"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


class WorkspaceError(Exception):
    """Root of the workspace's errors."""


class GitError(WorkspaceError):
    def __init__(self, args: Sequence[str], returncode: int, stderr: str) -> None:
        tail = stderr.strip()[-500:]
        super().__init__(f"git {' '.join(args)} exited with status {returncode}: {tail}")
        self.git_args = tuple(args)
        self.returncode = returncode
        self.stderr = stderr


class UnknownBranchError(WorkspaceError):
    def __init__(self, branch: str, item: str) -> None:
        super().__init__(
            f"there is no branch {branch}: build.implement has not committed item {item!r} "
            "in this cycle, so it cannot be integrated"
        )
        self.branch = branch


class MergeConflictError(WorkspaceError):
    def __init__(self, branch: str, stderr: str) -> None:
        super().__init__(
            f"{branch} does not merge cleanly into {INTEGRATION_BRANCH} (merge aborted): "
            f"{stderr.strip()[-500:]}"
        )
        self.branch = branch


class UnresolvedError(WorkspaceError):
    def __init__(self, item: str, detail: str) -> None:
        super().__init__(f"the conflict of item {item!r} is not resolved: {detail}")
        self.item = item


_MARKER = re.compile(r"^(<{7} |>{7} |={7}$)", re.M)


def git(cwd: Path, *args: str) -> str:
    """Runs ``git args`` in ``cwd``; its stdout, stripped. Raises :class:`GitError`."""
    done = subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, check=False, stdin=None
    )
    if done.returncode != 0:
        raise GitError(args, done.returncode, done.stderr)
    return done.stdout.strip()


def commit_all(worktree: Path, message: str) -> str:
    """Commits every change in ``worktree`` (none: no commit); the sha of HEAD after.

    Refuses unless ``worktree`` is itself the top of a git work tree: git searches parent
    directories for a repository, and committing "everything" into an enclosing repository
    (say, the one vibey runs from) must never happen."""
    top = Path(git(worktree, "rev-parse", "--show-toplevel")).resolve()
    if top != worktree.resolve():
        raise WorkspaceError(
            f"{worktree} is not a git worktree of its own (git found {top}); refusing to commit"
        )
    git(worktree, "add", "--all")
    staged = subprocess.run(
        ["git", "diff", "--cached", "--quiet"], cwd=worktree, capture_output=True, check=False
    )
    if staged.returncode == 1:
        git(worktree, "commit", "--quiet", "--no-verify", "-m", message)
    elif staged.returncode != 0:
        raise GitError(("diff", "--cached", "--quiet"), staged.returncode, staged.stderr.decode())
    return head(worktree)


def head(worktree: Path) -> str:
    return git(worktree, "rev-parse", "HEAD")


def current_branch(worktree: Path) -> str:
    return git(worktree, "symbolic-ref", "--short", "HEAD")


def item_branch(cycle: int, item: str) -> str:
    return f"vibey/c{cycle}/{checked_name(item, 'work item id')}"


def checked_name(name: str, what: str) -> str:
    """``name`` when it can be a directory and a branch name component; else an error."""
    if not _NAME.fullmatch(name) or ".." in name or name.endswith(".lock"):
        raise WorkspaceError(
            f"the {what} {name!r} cannot name a directory and a git branch: use letters, "
            "digits, '.', '_' and '-' (starting with a letter or digit, at most 100)"
        )
    return name


class Workspace:
    """The projects' repositories and worktrees under ``root``."""

    def __init__(self, root: Path) -> None:
        # Absolute: git resolves a relative worktree path against the repository, not us.
        self.root = root.resolve()

    def project_dir(self, project: str) -> Path:
        return self.root / checked_name(project, "project id")

    def repo(self, project: str) -> Path:
        """The project's repository, created with an initial empty commit on first use."""
        path = self.project_dir(project) / "repo"
        if (path / ".git").is_dir():
            return path
        with self._locked(project):
            if not (path / ".git").is_dir():
                _init_repo(path)
        return path

    def worktree(self, project: str, cycle: int, item: str) -> Path:
        """The work item's worktree on ``vibey/c<cycle>/<item>``, reused when it exists.

        A new branch starts from the integration branch when there is one (a later cycle
        builds on what earlier cycles integrated), else from main."""
        if cycle < 0:
            raise WorkspaceError(f"cycle must not be negative, got {cycle}")
        branch = item_branch(cycle, item)
        path = self.project_dir(project) / "worktrees" / f"c{cycle}-{item}"
        repo = self.repo(project)
        with self._locked(project):
            _ensure_worktree(repo, path, branch)
        return path

    def import_repo(self, project: str, source: str, branch: str | None = None) -> Path:
        """The project's repository cloned from ``source`` (a path or a URL), ``branch`` (or
        its default branch) becoming ``main``; a repository already there is kept as it is."""
        path = self.project_dir(project) / "repo"
        if (path / ".git").is_dir():
            return path
        with self._locked(project):
            if not (path / ".git").is_dir():
                _clone_repo(path, source, branch)
        return path

    def integrated(self, project: str) -> Path:
        """The integration worktree (branch ``vibey/integration``, from main when new): the
        integrated code, where verify, review and deploy work."""
        path = self.project_dir(project) / "worktrees" / "integration"
        repo = self.repo(project)
        with self._locked(project):
            _ensure_worktree(repo, path, INTEGRATION_BRANCH)
        return path

    def merge_queue(
        self, project: str, cycle: int, items: Sequence[str], *, hold: bool = False
    ) -> Pass:
        """One pass of the merge queue: each item's branch of ``cycle`` merged into the
        integration branch in the order of ``items`` (those merged already are no-ops); one
        that conflicts is left out (the merge aborted) and reported, and the pass goes on.

        ``hold`` (build.verify, which opens a pass): the items' holds are lifted first, and
        each item that conflicts is held (a file under ``<project>/held/``). Without it
        (build.integrate, which closes the pass) a held item is not tried but reported as
        it was held: what the pass's tests did not see never reaches the integrated tree,
        even when its branch changed meanwhile (a resolve, a person).

        Not serialised here: the caller holds the project and cycle's integration lock."""
        path = self.integrated(project)
        _clean(path)
        held = self.project_dir(project) / "held"
        if hold:
            for item in items:
                (held / _held_name(cycle, item)).unlink(missing_ok=True)

        def merge(item: str) -> Conflict | None:
            mark = held / _held_name(cycle, item)
            if not hold and mark.is_file():
                return _read_held(mark, item)
            conflict = _try_merge(path, cycle, item, items)
            if conflict is not None and hold:
                held.mkdir(parents=True, exist_ok=True)
                mark.write_text(
                    json.dumps({"files": conflict.files, "against": conflict.against}),
                    encoding="utf-8",
                )
            return conflict

        return merge_pass(list(items), merge)

    def start_resolve(self, project: str, cycle: int, item: str) -> tuple[Path, tuple[str, ...]]:
        """The item's worktree with the integration branch merged into its branch: the files
        left in conflict (none: it merged cleanly and is committed). A merge an earlier
        attempt left unfinished is dropped first."""
        path = self.worktree(project, cycle, item)
        self.integrated(project)  # the integration branch exists
        _clean(path)
        message = f"vibey: merge {INTEGRATION_BRANCH} into {item_branch(cycle, item)}"
        try:
            git(
                path,
                "merge",
                "--quiet",
                "--no-ff",
                "--no-verify",
                "-m",
                message,
                INTEGRATION_BRANCH,
            )
        except GitError:
            files = _unmerged(path)
            if not files:
                _clean(path)
                raise
            return path, files
        return path, ()

    def diff_stat(self, project: str) -> str:
        """What the integrated tree changed since main, as ``git diff --stat`` sums it up
        (its last line, as in "3 files changed, 40 insertions(+)"; "" for no change)."""
        path = self.integrated(project)
        lines = git(path, "diff", "--stat", f"{MAIN_BRANCH}...HEAD").splitlines()
        return lines[-1].strip() if lines else ""

    def push(self, project: str, remote: str, branch: str) -> str:
        """Pushes the integration branch to ``branch`` of ``remote`` (a URL or a path; a
        fast-forward, never forced); the commit pushed. A refusal raises :class:`GitError`."""
        path = self.integrated(project)
        commit = head(path)
        git(path, "push", "--quiet", remote, f"{commit}:refs/heads/{branch}")
        return commit

    @contextmanager
    def _locked(self, project: str) -> Iterator[None]:
        directory = self.project_dir(project)
        directory.mkdir(parents=True, exist_ok=True)
        with (directory / ".vibey.lock").open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)


def _init_repo(path: Path) -> None:
    """Builds the repository beside ``path`` and renames it into place, so a crash midway
    never leaves a half-made repository where one is expected."""
    staging = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
    staging.mkdir(parents=True)
    try:
        git(staging, "init", "--quiet", "-b", MAIN_BRANCH)
        for key, value in (
            ("user.name", GIT_IDENTITY),
            ("user.email", f"{GIT_IDENTITY}@localhost"),
            ("commit.gpgsign", "false"),
            ("gc.auto", "0"),
        ):
            git(staging, "config", key, value)
        git(staging, "commit", "--quiet", "--allow-empty", "--no-verify", "-m", "vibey: start")
        if path.exists():
            shutil.rmtree(path)
        staging.rename(path)
    finally:
        if staging.exists():
            shutil.rmtree(staging)


def _clone_repo(path: Path, source: str, branch: str | None) -> None:
    """Clones beside ``path`` and renames into place (see :func:`_init_repo`)."""
    staging = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
    staging.parent.mkdir(parents=True, exist_ok=True)
    try:
        args = ["clone", "--quiet", *(["--branch", branch] if branch else []), source, str(staging)]
        git(staging.parent, *args)
        git(staging, "checkout", "--quiet", "-B", MAIN_BRANCH)
        for key, value in (
            ("user.name", GIT_IDENTITY),
            ("user.email", f"{GIT_IDENTITY}@localhost"),
            ("commit.gpgsign", "false"),
            ("gc.auto", "0"),
        ):
            git(staging, "config", key, value)
        if path.exists():
            shutil.rmtree(path)
        staging.rename(path)
    finally:
        if staging.exists():
            shutil.rmtree(staging)


def _has_branch(repo: Path, branch: str) -> bool:
    found = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}"],
        cwd=repo,
        capture_output=True,
        check=False,
    )
    return found.returncode == 0


def _is_worktree(path: Path, branch: str) -> bool:
    if not (path / ".git").is_file():
        return False
    try:
        return current_branch(path) == branch
    except GitError:
        return False


def _ensure_worktree(repo: Path, path: Path, branch: str) -> None:
    if _is_worktree(path, branch):
        return
    if path.exists():  # left half-made by a crash: start it again
        shutil.rmtree(path)
    git(repo, "worktree", "prune")
    path.parent.mkdir(parents=True, exist_ok=True)
    if _has_branch(repo, branch):
        git(repo, "worktree", "add", "--quiet", str(path), branch)
        return
    base = INTEGRATION_BRANCH if _has_branch(repo, INTEGRATION_BRANCH) else MAIN_BRANCH
    git(repo, "worktree", "add", "--quiet", "-b", branch, str(path), base)


def _clean(path: Path) -> None:
    """Drops what an interrupted merge left behind; the integration branch only ever holds
    finished merges, so its HEAD is the state to return to."""
    if _in_merge(path):
        git(path, "merge", "--abort")
    git(path, "reset", "--quiet", "--hard", "HEAD")
    git(path, "clean", "--quiet", "-fd")


def _held_name(cycle: int, item: str) -> str:
    return f"c{cycle}-{checked_name(item, 'work item id')}.json"


def _read_held(mark: Path, item: str) -> Conflict:
    try:
        data = json.loads(mark.read_text(encoding="utf-8"))
        return Conflict(item, tuple(data["files"]), tuple(data["against"]))
    except (OSError, ValueError, KeyError, TypeError):
        return Conflict(item)


def _unmerged(path: Path) -> tuple[str, ...]:
    """The paths git left in conflict (unmerged in the index), sorted."""
    listed = git(path, "diff", "--name-only", "--diff-filter=U")
    return tuple(sorted(line for line in listed.splitlines() if line))


def _is_ancestor(path: Path, ancestor: str, of: str = "HEAD") -> bool:
    done = subprocess.run(
        ["git", "merge-base", "--is-ancestor", ancestor, of],
        cwd=path,
        capture_output=True,
        check=False,
    )
    return done.returncode == 0


def _try_merge(path: Path, cycle: int, item: str, items: Sequence[str]) -> Conflict | None:
    """Merges ``item``'s branch into the integration tree at ``path``; the conflict instead
    when it does not merge: its files, and which of ``items`` (merged already) changed them."""
    branch = item_branch(cycle, item)
    try:
        _merge(path, item, branch, cycle)
    except MergeConflictError:
        files = _unmerged(path)
        _clean(path)
        against = tuple(
            other
            for other in items
            if other != item
            and _has_branch(path, item_branch(cycle, other))
            and _is_ancestor(path, item_branch(cycle, other))
            and set(files) & set(_changed(path, branch, item_branch(cycle, other)))
        )
        return Conflict(item, files, against)
    return None


def _changed(path: Path, base: str, branch: str) -> list[str]:
    """The files ``branch`` changed since it and ``base`` parted."""
    return git(path, "diff", "--name-only", f"{base}...{branch}").splitlines()


def finish_resolve(worktree: Path, item: str, files: Sequence[str], message: str) -> str:
    """Commits a resolved merge of the integration branch in the item's ``worktree`` (or
    accepts the one the engine committed); the commit. Raises :class:`UnresolvedError` when a
    conflicting file still has a conflict marker or the integration branch is not merged."""
    marked = [f for f in files if _has_markers(worktree / f)]
    if marked:
        raise UnresolvedError(item, f"conflict markers are left in {', '.join(marked)}")
    if _in_merge(worktree):
        git(worktree, "add", "--all")
        git(worktree, "commit", "--quiet", "--no-verify", "-m", message)
    else:
        commit_all(worktree, message)
    if not _is_ancestor(worktree, INTEGRATION_BRANCH):
        raise UnresolvedError(item, f"{INTEGRATION_BRANCH} is not merged into its branch")
    return head(worktree)


def abort_resolve(worktree: Path) -> None:
    """Drops an unfinished resolution: the item's branch stays as it was."""
    _clean(worktree)


def _has_markers(path: Path) -> bool:
    try:
        return _MARKER.search(path.read_text(encoding="utf-8", errors="replace")) is not None
    except (FileNotFoundError, IsADirectoryError):
        return False


def _in_merge(path: Path) -> bool:
    found = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", "MERGE_HEAD"],
        cwd=path,
        capture_output=True,
        check=False,
    )
    return found.returncode == 0


def _merge(path: Path, item: str, branch: str, cycle: int) -> None:
    """Merges ``branch`` into the tree at ``path``; on a conflict :class:`MergeConflictError`
    is raised with the merge left in place (the caller reads the conflict, then aborts it)."""
    if not _has_branch(path, branch):
        raise UnknownBranchError(branch, item)
    merged = subprocess.run(
        ["git", "merge-base", "--is-ancestor", branch, "HEAD"],
        cwd=path,
        capture_output=True,
        check=False,
    )
    if merged.returncode == 0:
        return
    message = f"vibey: merge {branch} (cycle {cycle}, item {item})"
    try:
        git(path, "merge", "--quiet", "--no-ff", "--no-verify", "-m", message, branch)
    except GitError as exc:
        raise MergeConflictError(branch, exc.stderr) from exc

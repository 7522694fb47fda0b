"""The one way trainguard touches a run folder or a distillation cache: no link followed, regular files
only, reads capped.

A run folder is shared ground: a colleague's copy, a folder on a shared file system, an archive someone
sent. Anything in it may have been planted. A `status.json` that is a symbolic link to `~/.bashrc` must
not make the next write land there; an `output.log` that is a FIFO or a link to /dev/zero must not hang
`trainguard report` or eat all memory. So:

- every file is opened with O_NOFOLLOW (a link in its place is refused, never followed) and checked with
  fstat on the open descriptor to be a regular file (a FIFO is opened with O_NONBLOCK, so even the open
  cannot block);
- a file trainguard writes whole is written fresh (`write_atomic`: a temp file made with O_EXCL, renamed
  over the name: a rename replaces a planted link, it does not write through it); a file it appends to
  (`open_append`) is opened with O_NOFOLLOW and must be a regular file with one name (a hard link to a file
  elsewhere is refused as well);
- a subfolder (`subdir`) is made or checked with lstat: a folder, not a link;
- reads are capped (`read_capped` refuses more than its limit; `read_tail` reads the end only);
- the run folder itself is checked once, when a run starts writing it (`check_run_dir`): the user's own
  folder (owner = this user; root is let through, see there), a link only where the user named the link,
  and none of the names trainguard writes planted as a link or a special file.

Refusals are `UserError`s: one line that names the file and the fix, exit 2 in the CLI.

The folder the user named may itself be a link (`--run-dir /scratch/run` where /scratch is a link): only
the names *inside* it are opened without following. A name swapped for a link between the check and the
open is still refused by the open itself (O_NOFOLLOW); in a folder that only its owner can write, nobody
else can swap a folder component under us.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path

from trainguard.errors import UserError

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)

# every name trainguard writes or reads at the top of a run folder; `check_run_dir` refuses a planted one
RUN_FILES = ("status.json", ".status.reserve", "output.log", "run.db", "run.db-wal", "run.db-shm", "run.db-journal",
             "guard.log", "report.md", "report.html", "schedule.json", "preflight.json", "outside-writes.txt",
             "metrics.prom", "stop-requested", "acks.jsonl")
RUN_FOLDERS = ("stacks", "workers", "tensorboard")
_REPLACED_AT_END = ("report.md", "report.html")


def _kind(mode: int) -> str:
    return ("a symbolic link" if stat.S_ISLNK(mode) else "a folder" if stat.S_ISDIR(mode)
            else "a FIFO (named pipe)" if stat.S_ISFIFO(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "not a regular file")


def refused(path: str | os.PathLike, kind: str, what: str = "file") -> UserError:
    plain = "a regular file" if what != "folder" else "a folder"
    return UserError(f"{path} is {kind}, not {plain}: trainguard neither follows links nor reads special files "
                     f"in a run folder (remove it, or run into a fresh folder)")


def _open_error(path: str | os.PathLike, exc: OSError, what: str) -> UserError:
    if exc.errno == errno.ELOOP:
        return refused(path, "a symbolic link", what)
    if exc.errno == errno.ENOENT:
        return UserError(f"{path}: no such {what}")
    return UserError(f"cannot open {path}: {exc.strerror or exc}")


def open_fd(path: str | os.PathLike, what: str = "file") -> int:
    """A read-only descriptor of the regular file at `path`, never through a link, never blocking on a FIFO.
    Raises UserError (FileNotFoundError stays a UserError too: the message says so)."""
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _NONBLOCK | _CLOEXEC)
    except OSError as exc:
        raise _open_error(path, exc, what) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise refused(path, _kind(mode), what)
        if _NONBLOCK:
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def exists(path: str | os.PathLike) -> bool:
    """Whether a name is there at all (a link counts, dangling or not: it is refused when opened)."""
    return os.path.lexists(path)


def read_capped(path: str | os.PathLike, limit: int, what: str = "file") -> bytes:
    """The whole file; UserError when it is larger than `limit` bytes (a damaged or hostile file)."""
    fd = open_fd(path, what)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise UserError(f"{path} is {size:,} bytes, more than a {what} can be ({limit:,}): damaged? "
                            f"(remove it, or run into a fresh folder)")
        chunks, got = [], 0
        while got <= limit:  # the size may grow while we read (a live writer): never more than the cap
            chunk = os.read(fd, min(1 << 20, limit + 1 - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        if got > limit:
            raise UserError(f"{path} grew past {limit:,} bytes while being read: damaged?")
        return b"".join(chunks)
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def _read_upto(fd: int, nbytes: int) -> bytes:
    """At most `nbytes` from `fd`'s position, in reads of 1 MiB (a short read is not the end)."""
    chunks, got = [], 0
    while got < nbytes:
        chunk = os.read(fd, min(1 << 20, nbytes - got))
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def read_tail(path: str | os.PathLike, nbytes: int, what: str = "file") -> bytes:
    """The last `nbytes` of a regular file (a log of any size costs at most that)."""
    fd = open_fd(path, what)
    try:
        size = os.fstat(fd).st_size
        os.lseek(fd, max(0, size - nbytes), os.SEEK_SET)
        return _read_upto(fd, nbytes)
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def read_head(path: str | os.PathLike, nbytes: int, what: str = "file") -> bytes:
    """The first `nbytes` of a regular file."""
    fd = open_fd(path, what)
    try:
        return _read_upto(fd, nbytes)
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def open_append(path: str | os.PathLike, mode: int = 0o644) -> int:
    """A descriptor that appends to the regular file at `path` (made if missing). Raises OSError (ELOOP for
    a link, EINVAL for anything else that is not a plain file of one name): writers are fail-open and
    catch it."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | _NOFOLLOW | _NONBLOCK | _CLOEXEC, mode)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
            raise OSError(errno.EINVAL, f"{path} is {_kind(st.st_mode) if not stat.S_ISREG(st.st_mode) else 'a hard link to another file'}, "
                                        f"not a file of this run")
        if _NONBLOCK:
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def create_fresh(path: str | os.PathLike, mode: int = 0o644) -> int:
    """A new, empty file at `path` opened for writing: whatever was at the name (a planted link included)
    is removed first, and the file is created with O_EXCL, so the write can only land in a file made now."""
    try:
        os.unlink(path)  # removes a link itself, never its target
    except FileNotFoundError:
        pass
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, mode)


def write_atomic(path: str | os.PathLike, data: str | bytes, mode: int = 0o644) -> None:
    """Writes `path` so that a reader never sees half of it and a planted link is replaced, not written
    through: a temp file beside it (mkstemp: O_EXCL), renamed over the name."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.chmod(tmp, mode)  # mkstemp makes it private; these files are for reading
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def subdir(path: str | os.PathLike, create: bool = True) -> Path:
    """The subfolder `path` of a run folder, made when missing: a real folder, never a link (OSError
    otherwise, with ELOOP for a link: a writer catches it; `checked_subdir` is the readers' form)."""
    p = Path(path)
    if create:
        try:
            os.mkdir(p, 0o755)
        except FileExistsError:
            pass
    st = os.lstat(p)
    if stat.S_ISLNK(st.st_mode):
        raise OSError(errno.ELOOP, f"{p} is a symbolic link: trainguard does not follow links in a run folder")
    if not stat.S_ISDIR(st.st_mode):
        raise OSError(errno.ENOTDIR, f"{p} is {_kind(st.st_mode)}, not a folder")
    return p


def checked_subdir(path: str | os.PathLike) -> Path | None:
    """For readers: the subfolder when it is a real folder, None when missing; UserError when it is a link
    or not a folder."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise refused(path, _kind(st.st_mode), "folder")
    return Path(path)


def regular_or_missing(path: str | os.PathLike, what: str = "file") -> bool:
    """True when `path` is a regular file, False when nothing is there; UserError for a link or a special
    file in its place (lstat: the link itself is looked at)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(mode):
        raise refused(path, _kind(mode), what)
    return True


def check_run_dir(path: str | os.PathLike) -> Path:
    """The check a run makes once on the folder it is about to write: UserError, in one line, for a folder
    of another user, or for any name trainguard writes that is planted as a link or a special file.

    The folder's own path may be a link (the user named it); what is inside is not followed."""
    p = Path(path)
    try:
        st = os.stat(p)
    except OSError as exc:
        raise UserError(f"cannot use run folder {p}: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise UserError(f"run folder {p} is not a folder")
    # (root is let through: in a container, root writes to folders mounted with the host user's uid; the
    # opens that follow no link are what protect it there)
    if hasattr(os, "geteuid") and os.geteuid() != 0 and st.st_uid != os.geteuid():
        raise UserError(f"run folder {p} belongs to another user (uid {st.st_uid}): trainguard writes only into "
                        f"a folder of yours (name another with --run-dir)")
    for name in RUN_FILES:
        try:
            regular_or_missing(p / name, "file")
        except UserError:
            if name in _REPLACED_AT_END and os.path.isdir(p / name) and not os.path.islink(p / name):
                continue  # written by a rename at the end, fail-open: a folder there costs that file only
            raise
    for name in RUN_FOLDERS:
        checked_subdir(p / name)
    return p


def check_sqlite(db_path: str | os.PathLike) -> None:
    """SQLite opens a database and its -wal, -shm and -journal files by name, following links: each must be
    missing or a regular file before it is opened (UserError otherwise)."""
    for suffix in ("", "-wal", "-shm", "-journal"):
        regular_or_missing(f"{os.fspath(db_path)}{suffix}", "file")

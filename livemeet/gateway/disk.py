"""The data directory's disk budget: new work is refused before the disk is full, and stored
transcripts older than the retention are deleted (DESIGN section 7: "Retention and a disk
budget are settings").

A live session whose journal cannot write is ended mid-meeting (its final transcript, then
`storage_failed`: it cannot be resumed), so a server whose data directory is nearly full
refuses new live sessions and uploads up front, with the same error (507), and says so in
`/readyz`; resumes and sessions already running go on. Once
under the floor, it takes new work again only above the floor plus DISK_READY_MARGIN_MB
(hysteresis), so that its own writes and deletes near the floor do not flip it back and forth.
"""

from __future__ import annotations

import logging
import os
import pwd
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from livemeet.audio.constants import (
    DISK_CHECK_INTERVAL_S,
    DISK_READY_MARGIN_MB,
    DISK_RETRY_AFTER_S,
)
from livemeet.config import flag_number
from livemeet.errors import StorageFailed

log = logging.getLogger(__name__)

MIB = 1 << 20
# what the server makes of its data directory: its owner's alone (meetings' audio and
# transcripts; under the usual umask 022 they were every local user's to read)
PRIVATE_DIR_MODE = 0o700


def make_private_dir(path: Path) -> None:
    """`mkdir -p path`, each directory it makes PRIVATE_DIR_MODE (a `mkdir -p` makes the
    missing parents with the default mode); those already there are left as they are.
    Raises OSError (FileExistsError where `path` is not a directory)."""
    try:
        path.mkdir(mode=PRIVATE_DIR_MODE, exist_ok=True)
    except FileNotFoundError:
        if path.parent == path:
            raise
        make_private_dir(path.parent)
        path.mkdir(mode=PRIVATE_DIR_MODE, exist_ok=True)


def permission_hint(path: Path, data_dir: Path) -> str:
    """What a refusal of `path` (EACCES) is likely about, to append to its message: the
    nearest of `path` and its parents that this process may stat, its owner and mode, and
    the user livemeet runs as; where that is `data_dir` or under it and another user's (and
    livemeet does not run as root), how to hand it over. A data dir a root run had made was
    "Permission denied" (or a traceback) for the service user meant to run the server (the
    container trial)."""
    me = os.geteuid()
    for candidate in (path.absolute(), *path.absolute().parents):
        try:
            st = candidate.stat()
        except OSError:
            continue
        hint = (
            f" ({candidate} is {_user_name(st.st_uid)}'s, mode {st.st_mode & 0o7777:04o}, "
            f"and livemeet runs as {_user_name(me)}"
        )
        top = data_dir.absolute()
        # root is refused only where the file system says so (NFS's root squash): no chown
        ours = candidate == top or top in candidate.parents
        if ours and st.st_uid != me and me != 0:
            hint += (
                f": another user's run made it? as root, `chown -R {_chown_name(me)} {top}`; "
                f"or run livemeet as {_user_name(st.st_uid)}"
            )
        return hint + ")"
    return ""


def refusal_hint(exc: BaseException, path: Path, data_dir: Path) -> str:
    """`permission_hint(path, data_dir)` where `exc` is a refusal by permissions
    (PermissionError), else "": what an OSError's message gains, whatever its kind."""
    return permission_hint(path, data_dir) if isinstance(exc, PermissionError) else ""


def owner_root_writes_for(path: Path) -> str | None:
    """The user whose directory `path` is where this process runs as root and that user is
    not: what root writes there is root's, and that user's own server is refused it later
    (a root run kept a session in the service user's data dir: the service user's next
    start failed on its audio file, the container trial). None otherwise, or where `path`
    cannot be looked at."""
    try:
        uid = path.stat().st_uid
    except OSError:
        return None
    return _user_name(uid) if os.geteuid() == 0 and uid != 0 else None


def _user_name(uid: int) -> str:
    name = _chown_name(uid)
    return name if not name.isdigit() else f"uid {uid}"


def _chown_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:  # a container's arbitrary user id has no passwd entry
        return str(uid)


def sync_directory(directory: Path) -> None:
    """fsync `directory` itself, so that names made or renamed in it are on disk (POSIX: a
    file's own fsync does not cover its name). Raises OSError."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def exposed_dirs(paths: list[Path]) -> list[str]:
    """Those of `paths` (directories) that other users of the machine may read or enter, as
    `path (mode 0755)`, for a warning; missing ones are skipped."""
    exposed = []
    for path in paths:
        try:
            mode = path.stat().st_mode & 0o777
        except OSError:
            continue
        if mode & 0o007:
            exposed.append(f"{path} (mode {mode:04o})")
    return exposed


class DiskGuard:
    """Free space under `path` against a floor of `min_free_bytes` (0: no floor), looked up at
    most every DISK_CHECK_INTERVAL_S (a statvfs per new session is cheap; per frame it is
    not). `low` turns on under the floor and off only at `min_free_bytes + margin_bytes`
    (default DISK_READY_MARGIN_MB); each change after the first look is logged."""

    def __init__(
        self,
        path: Path,
        min_free_bytes: int,
        *,
        margin_bytes: int = int(DISK_READY_MARGIN_MB * MIB),
        clock: Callable[[], float] = time.monotonic,
        usage: Callable[[Path], int] = lambda p: shutil.disk_usage(p).free,
    ) -> None:
        self.path = path
        self.min_free_bytes = min_free_bytes
        self.margin_bytes = margin_bytes
        self._clock = clock
        self._usage = usage
        self._free: int | None = None
        self._at = -float("inf")
        self._low: bool | None = None  # None until the first look

    @property
    def ready_bytes(self) -> int:
        """Free bytes a server that fell under the floor needs before it takes new work."""
        return self.min_free_bytes + self.margin_bytes

    def free_bytes(self) -> int | None:
        """Free bytes on the data directory's file system (None: it cannot be read)."""
        now = self._clock()
        if now - self._at >= DISK_CHECK_INTERVAL_S:
            self._at = now
            try:
                self._free = self._usage(self.path)
            except OSError as exc:  # not made yet, or gone: the writes will say why
                log.debug("free space of %s unknown: %s", self.path, exc)
                self._free = None
        return self._free

    @property
    def low(self) -> bool:
        """Whether new work is refused for lack of disk: from when the free space is under
        the floor until it is back at `ready_bytes`. False without a floor, or where the free
        space cannot be read."""
        free = self.free_bytes()
        if self.min_free_bytes <= 0 or free is None:
            low = False
        elif free < self.min_free_bytes:
            low = True
        elif free >= self.ready_bytes:
            low = False
        else:  # between the floor and the margin: as it was
            low = bool(self._low)
        if self._low is not None and low != self._low:
            self._log_change(low, free)
        self._low = low
        return low

    def _log_change(self, low: bool, free: int | None) -> None:
        if free is None:  # not "0 MiB free again": the look failed, and writes will tell
            log.warning(
                "the data dir's free space cannot be read (%s): new live sessions and uploads "
                "are taken",
                self.path,
            )
        elif low:
            log.warning(
                "the data dir's disk has %.0f MiB free, under --min-free-disk-mb %s: new live "
                "sessions and uploads are refused until %s MiB are free",
                free / MIB,
                flag_number(self.min_free_bytes / MIB),
                flag_number(self.ready_bytes / MIB),
            )
        else:
            log.info(
                "the data dir's disk has %.0f MiB free again: new live sessions and uploads "
                "are taken",
                free / MIB,
            )

    def check(self, what: str) -> None:
        """Raise StorageFailed (507) for new work (`what`: "live sessions", "uploads") while
        `low`."""
        if self.low:
            free = self.free_bytes() or 0
            floor = flag_number(self.min_free_bytes / MIB)
            where = "under" if free < self.min_free_bytes else "since it fell under"
            raise StorageFailed(
                f"the server's disk is nearly full ({free / MIB:.0f} MiB free {where} its "
                f"--min-free-disk-mb {floor}): no new {what} until "
                f"{flag_number(self.ready_bytes / MIB)} MiB are free",
                retry_after_s=DISK_RETRY_AFTER_S,  # space is freed by hand, not in a second
            )


def remove_older_than(directory: Path, max_age_s: float, now: float | None = None) -> list[Path]:
    """Delete the files directly in `directory` last modified more than `max_age_s` ago (a
    transcript store's JSON files); returns them. Blocking: run it off the loop. A file that
    cannot be deleted is logged and kept."""
    cutoff = (time.time() if now is None else now) - max_age_s
    removed: list[Path] = []
    try:
        entries = list(directory.iterdir())
    except FileNotFoundError:
        return removed
    for path in entries:
        try:
            if path.is_file() and path.stat().st_mtime < cutoff:
                path.unlink()
                removed.append(path)
        except OSError as exc:
            log.warning("retention: %s not deleted: %s", path, exc)
    return removed

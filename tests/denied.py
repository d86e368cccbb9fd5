"""`deny_access`: a path as a user without permission sees it, for tests that run as root (CI
does, and root reads and writes whatever the mode bits say)."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest


def deny_access(monkeypatch: pytest.MonkeyPatch, path: Path) -> None:
    """Make `path` behave as `chmod 000` makes it for a user other than its owner, as far as
    os.open, os.stat and os.scandir go (pathlib's stat, exists, is_file and is_dir use them;
    builtins.open and C extensions do not): opening `path` fails with EACCES, and for a
    directory, listing it and reaching anything under it too; its own stat still works, as
    the parent's permission governs that."""
    denied = os.path.abspath(path)

    def refused(target: Any, *, itself: bool) -> bool:
        if isinstance(target, int):  # a file descriptor: already open
            return False
        name = os.path.abspath(os.fsdecode(target))
        return (itself and name == denied) or name.startswith(denied + os.sep)

    def error(target: Any) -> PermissionError:
        return PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fsdecode(target))

    real_open, real_stat, real_scandir = os.open, os.stat, os.scandir

    def fake_open(target: Any, *args: Any, **kwargs: Any) -> int:
        if refused(target, itself=True):
            raise error(target)
        return real_open(target, *args, **kwargs)

    def fake_stat(target: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        if refused(target, itself=False):
            raise error(target)
        return real_stat(target, *args, **kwargs)

    def fake_scandir(target: Any = ".") -> Any:
        if refused(target, itself=True):
            raise error(target)
        return real_scandir(target)

    monkeypatch.setattr(os, "open", fake_open)
    monkeypatch.setattr(os, "stat", fake_stat)
    monkeypatch.setattr(os, "scandir", fake_scandir)

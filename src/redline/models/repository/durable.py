"""Writes that a crash or a full disk never leave half done: a file is fsynced (and renamed
into place when it replaces one), a version is assembled in a hidden temporary folder and
renamed into place whole, and the temporaries of writers that died are swept."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from redline.errors import RepositoryError
from redline.models.metadata import ModelMetadata
from redline.models.repository.layout import METADATA_FILE, MODEL_FILE

TMP_PREFIX = ".tmp-"


def write_version(
    folder: Path, data: bytes | None, meta: ModelMetadata, version: int | None,
    files: dict[str, Path] | None, taken: Callable[[], list[int]],
) -> ModelMetadata:
    """Store ``meta`` (with ``data`` as ``model.onnx`` and ``files`` beside it) as version
    ``version`` of the model in ``folder``, else as the next one after those ``taken`` says."""
    name = folder.name
    folder.mkdir(parents=True, exist_ok=True)
    sweep_temporaries(folder)
    tmp = folder / f"{TMP_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        tmp.mkdir()
        if data is not None:
            write_durably(tmp / MODEL_FILE, data)
        for file_name, path in (files or {}).items():
            (tmp / file_name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, tmp / file_name)
        for _attempt in range(100):
            number = version if version is not None else max(taken(), default=0) + 1
            meta.version = number
            write_durably(tmp / METADATA_FILE, dumps(meta.to_dict()))
            target = folder / str(number)
            try:
                os.rename(tmp, target)  # atomic: the version appears whole or not at all
            except OSError as exc:
                if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
                    if version is not None:
                        raise RepositoryError(
                            f"model '{name}' already has version {version}; choose another "
                            "number or omit --version to take the next one"
                        ) from exc
                    continue  # another writer took this number: take the next one
                raise
            fsync_dir(folder)
            return meta
        raise RepositoryError(f"could not allocate a version number for model '{name}'")
    except OSError as exc:
        reason = "the disk is full" if exc.errno == errno.ENOSPC else exc.strerror or str(exc)
        raise RepositoryError(
            f"could not write model '{name}' to {folder}: {reason}; nothing was added"
        ) from exc
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def remove_folder(target: Path, tag: str) -> None:
    """Make ``target`` disappear in one rename, then delete it."""
    trash = target.with_name(f"{TMP_PREFIX}{os.getpid()}-{tag}")
    os.rename(target, trash)
    shutil.rmtree(trash, ignore_errors=True)


def sweep_temporaries(folder: Path) -> None:
    """Remove temporary folders left by writers that died (their pid no longer runs)."""
    for p in folder.glob(f"{TMP_PREFIX}*"):
        pid_text = p.name[len(TMP_PREFIX) :].split("-", 1)[0]
        if pid_text.isdigit() and not _pid_alive(int(pid_text)):
            shutil.rmtree(p, ignore_errors=True)


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, indent=2, sort_keys=True).encode() + b"\n"


def write_durably(path: Path, data: bytes, *, atomic: bool = False) -> None:
    target = path.with_name(f"{path.name}.{uuid.uuid4().hex[:8]}.part") if atomic else path
    try:
        with target.open("wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if atomic:
            os.replace(target, path)
    finally:
        if atomic and target.exists():
            target.unlink()


def fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

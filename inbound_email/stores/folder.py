"""The folder store: a local folder of raw mail files, the embedded default.

Every OS error becomes a StoreError that says whether a retry could help.
"""

from __future__ import annotations

import errno
import logging
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from stat import S_ISLNK, S_ISREG

from inbound_email.exceptions import StoreError, StoreNotFound
from inbound_email.stores.base import StoredObject, safe_key, skip_key

logger = logging.getLogger(__name__)

# Write errors that the same write meets again on every attempt.
_NEVER_WRITABLE = frozenset(
    {errno.ENAMETOOLONG, errno.ENOTDIR, errno.EISDIR, errno.EEXIST, errno.EILSEQ, errno.EINVAL}
)


def _remove_quietly(path: Path) -> None:
    """Remove a temporary file of a failed write; a failure to remove it is logged (the
    write's own error is the one raised)."""
    try:
        path.unlink(missing_ok=True)
    except OSError as exc:
        logger.warning(
            "temporary file %s of a failed write could not be removed: %s",
            path.name,
            exc,
            extra={"action": "store_temp_file_left", "path": str(path)},
        )


class FolderStore:
    """A local folder: the embedded default. Keys are paths relative to the folder.

    Writers should write to a dot-file and rename it, so a half-written file is never listed.
    A key names a directory entry, never what a symlink points to: a symlink is listed (so its
    row ends quarantined with the reason) but never read, and it is moved and deleted as the
    link itself, never its target, which may be outside the folder or another mail.
    """

    def __init__(
        self, root: Path, quarantine_prefix: str, attachments_prefix: str = "attachments/"
    ) -> None:
        self.root = Path(root)
        self.quarantine_prefix = quarantine_prefix.strip("/") + "/" if quarantine_prefix else ""
        self.attachments_prefix = (
            attachments_prefix.strip("/") + "/" if attachments_prefix.strip("/") else ""
        )
        self.description = str(self.root)

    def _path(self, key: str) -> Path:
        """The entry `key` names: its directory resolved and inside the folder, its last part
        not followed (resolving it too sent a delete of a symlink to the file it names)."""
        root = self.root.resolve()
        path = root / key
        parent = path.parent.resolve()
        if path.name in ("", ".", "..") or (parent != root and root not in parent.parents):
            raise StoreError(f"key {key!r} escapes the mail folder", transient=False)
        return parent / path.name

    def _link_error(self, key: str, path: Path) -> StoreError:
        """A symlink is not read: its target may be anything (outside the folder, another
        mail, a device). Permanent, naming the target for the operator."""
        try:
            target = safe_key(os.readlink(path))
        except OSError:
            target = "?"
        return StoreError(f"{key} is a symbolic link (to {target}): not read", transient=False)

    def list(self) -> Iterator[list[StoredObject]]:
        if not self.root.is_dir():
            return
        page: list[StoredObject] = []
        try:
            for dirpath, dirnames, filenames in os.walk(self.root):
                dirnames.sort()
                for name in sorted(filenames):
                    path = Path(dirpath) / name
                    key = path.relative_to(self.root).as_posix()
                    if skip_key(key, self.quarantine_prefix, self.attachments_prefix):
                        continue
                    if safe_key(key) != key:
                        renamed = self._rename_to_safe_key(path, key)
                        if renamed is None:
                            continue
                        path, key = renamed
                    try:
                        stat = path.lstat()
                    except FileNotFoundError:
                        continue  # handled and deleted by another poller meanwhile
                    if not (S_ISREG(stat.st_mode) or S_ISLNK(stat.st_mode)):
                        # A named pipe would block its reader (the poll) for good; a socket
                        # or device is not mail either. Left alone, and said.
                        logger.warning(
                            "%s in the mail folder is not a regular file: not polled",
                            key,
                            extra={"action": "inbound_not_a_file", "mail_key": key},
                        )
                        continue
                    page.append(
                        StoredObject(key, stat.st_size, f"{stat.st_mtime_ns}-{stat.st_size}")
                    )
                    if len(page) == 1000:
                        yield page
                        page = []
        except OSError as exc:
            raise StoreError(f"listing {self.root} failed: {exc}", transient=True) from exc
        if page:
            yield page

    def _rename_to_safe_key(self, path: Path, key: str) -> tuple[Path, str] | None:
        """Give a file whose name the ledger cannot hold (not UTF-8, too long) its `safe_key` name.

        Never overwrites: the file is hard-linked under the new name, then the old name is
        removed. None (the file stays as it is, logged) when another file has the new name or
        the rename failed; a file another poller renamed meanwhile is simply not listed here.
        """
        new_key = safe_key(key)
        target = self.root / new_key
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(path, target)
            except FileExistsError:
                if not os.path.samefile(path, target):  # a third file: keep both untouched
                    logger.error(
                        "mail file %s: its name cannot be stored (not UTF-8, or too long) "
                        "and %s is taken: left in place, not polled",
                        new_key,
                        new_key,
                        extra={"action": "inbound_key_unsafe", "mail_key": new_key},
                    )
                    return None
            path.unlink()
        except FileNotFoundError:
            return None  # renamed (or handled) by another poller meanwhile
        except OSError as exc:
            logger.error(
                "mail file %s: its name cannot be stored (not UTF-8, or too long) and "
                "could not be renamed: %s",
                new_key,
                exc,
                extra={"action": "inbound_key_unsafe", "mail_key": new_key},
            )
            return None
        logger.warning(
            "mail file renamed to %s: its name could not be stored (not UTF-8, or too long)",
            new_key,
            extra={"action": "inbound_key_renamed", "mail_key": new_key},
        )
        return target, new_key

    def get(self, key: str) -> bytes:
        path = self._path(key)
        try:
            # O_NONBLOCK: opening a named pipe put there since the listing must not block.
            # O_NOFOLLOW: a symlink is refused (ELOOP), never read through.
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as handle:
                if not S_ISREG(os.fstat(handle.fileno()).st_mode):
                    raise StoreError(f"{key} is not a regular file", transient=False)
                return handle.read()
        except FileNotFoundError as exc:
            if not self.root.is_dir():  # unmounted, say: the mail is not known to be gone
                raise StoreError(
                    f"reading {key} failed: the mail folder {self.root} is missing",
                    transient=True,
                ) from exc
            raise StoreNotFound(f"{key} not found in {self.root}") from exc
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise self._link_error(key, path) from exc
            raise StoreError(f"reading {key} failed: {exc}", transient=True) from exc

    get_quarantined = get

    def put(self, key: str, data: bytes) -> None:
        """Write through a dot-file renamed into place; the dot-file never outlives a failed
        write (issue 28.1: one was left per attempt). A name the file system can never take
        (too long, not a folder where one is needed, a folder where the file goes) is a
        permanent error: retrying it only spends the mail's attempts."""
        path = self._path(key)
        tmp = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".incoming-")
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            os.replace(tmp, path)
            tmp = None
        except OSError as exc:
            raise StoreError(
                f"writing {key} failed: {exc}", transient=exc.errno not in _NEVER_WRITABLE
            ) from exc
        finally:
            if tmp is not None:
                _remove_quietly(Path(tmp))

    def quarantine(self, key: str) -> str:
        """Copy the entry to the quarantine prefix: a file's bytes, a symlink as a link with
        the same target (it cannot be read, and must leave the intake all the same)."""
        target = self.quarantine_prefix + key
        path = self._path(key)
        try:
            link = os.readlink(path)
        except FileNotFoundError as exc:
            raise StoreNotFound(f"{key} not found in {self.root}") from exc
        except OSError:  # not a symlink (EINVAL): the mail's bytes
            self.put(target, self.get(key))
            return target
        copy = self._path(target)
        try:
            copy.parent.mkdir(parents=True, exist_ok=True)
            copy.unlink(missing_ok=True)
            os.symlink(link, copy)
        except OSError as exc:
            raise StoreError(f"quarantining the link {key} failed: {exc}", transient=True) from exc
        return target

    def delete(self, key: str) -> None:
        try:
            self._path(key).unlink(missing_ok=True)
        except OSError as exc:
            raise StoreError(f"deleting {key} failed: {exc}", transient=True) from exc

    def delete_many(self, keys: list[str]) -> dict[str, str]:
        failed: dict[str, str] = {}
        for key in keys:
            try:
                self.delete(key)
            except StoreError as exc:
                failed[key] = str(exc)
        return failed

    def exists(self, key: str) -> bool:
        """Whether the entry is there (a file, or a symlink whatever it points to)."""
        path = self._path(key)
        return path.is_symlink() or path.is_file()

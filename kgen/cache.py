"""Content-addressed cubin cache (DESIGN §7).

An entry is a directory <root>/v<schema>/<key[:2]>/<key>/ holding kernel.cu, kernel.cubin and
meta.json. It is built in a private temp dir, fsync'd, then renamed into place, so readers see
a whole entry or none. meta.json records the cubin's size and sha256: a truncated or corrupt
entry fails that check and is rebuilt. A per-key file lock makes N processes (8 TP ranks) that
miss at once compile each kernel once: the first builds, the others wait and then hit.

`clear` is safe against builds in other processes: every write (staging, renaming into place,
discarding) holds a shared lock on <root>/clear.lock and clear holds it exclusively, so clear never
removes a staging directory or an entry's parent under a writer; it leaves locks/ alone (a running
build may hold its per-key lock). Readers take no lock: an entry that vanishes mid-read is a miss.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import uuid
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from filelock import FileLock

from . import env
from .errors import CacheError, CacheMissError, CacheWarning
from .version import __version__

SCHEMA_VERSION = 1
warnings.filterwarnings("always", category=CacheWarning)  # each repair is reported (once: see _warned)
_warned: set[str] = set()


def cache_key(*, source: str, headers: dict[str, str], nvrtc_version: str, options: list[str], arch: str) -> str:
    h = hashlib.sha256()
    for part in (f"schema={SCHEMA_VERSION}", f"kgen={__version__}", f"nvrtc={nvrtc_version}",
                 f"arch={arch}", "options=" + "\x1f".join(options), source):
        h.update(part.encode())
        h.update(b"\x1e")
    for name in sorted(headers):
        h.update(name.encode() + b"\x1f" + headers[name].encode() + b"\x1e")
    return h.hexdigest()


@dataclass(frozen=True)
class Entry:
    path: Path
    cubin: bytes
    meta: dict


class KernelCache:
    def __init__(self, root: Path | None = None):
        self.root = Path(root) if root is not None else env.cache_root()
        self.entries = self.root / f"v{SCHEMA_VERSION}"
        self.described = (f"the kernel cache {self.root}" if root is not None or env.path("KGEN_CACHE_DIR") is None
                          else f"KGEN_CACHE_DIR={self.root}")
        existing = next(d for d in (self.root, *self.root.parents) if d.exists())  # the root, or where it would go
        if not existing.is_dir():
            what = "is not a directory" if existing == self.root else f"is inside {existing}, a file"
            raise CacheError(f"{self.described} {what}; set KGEN_CACHE_DIR to a directory kgen may "
                             f"create and write (default ~/.cache/kgen)")

    @contextmanager
    def _writing(self, exclusive: bool = False):
        """Held (shared) around every write, exclusively by clear; an OSError becomes one line."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            with open(self.root / "clear.lock", "a") as f:
                fcntl.flock(f, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
                yield
        except CacheError:
            raise
        except OSError as e:
            raise self._unwritable(e) from None

    def _unwritable(self, e: OSError) -> CacheError:
        return CacheError(f"{self.described}: cannot write {e.filename or self.root} ({e.strerror}); set "
                          f"KGEN_CACHE_DIR to a directory kgen may create and write")

    def entry_dir(self, key: str) -> Path:
        return self.entries / key[:2] / key

    def lookup(self, key: str) -> Entry | None:
        """The entry for `key`, or None if absent; a damaged entry is removed and reported absent.
        An entry that lands (or is replaced) while we read looks damaged for a moment, so a damaged
        look is read once more before the entry is judged: a miss must never remove a good entry."""
        path = self.entry_dir(key)
        for _ in range(2):
            found = self._read(path)
            if not isinstance(found, str):
                return found
        self._repair(path, found)
        return None

    @staticmethod
    def _read(path: Path) -> Entry | str | None:
        """The entry at `path`, None if there is none, or why it is damaged."""
        try:
            meta = json.loads((path / "meta.json").read_text())
            cubin = (path / "kernel.cubin").read_bytes()
        except (FileNotFoundError, NotADirectoryError) as e:
            return f"{Path(e.filename).name} is missing" if path.is_dir() else None
        except (OSError, ValueError) as e:
            return f"unreadable: {e}"
        if not isinstance(meta, dict) or meta.get("cubin_bytes") != len(cubin):
            return (f"kernel.cubin has {len(cubin)} bytes, meta.json says "
                    f"{meta.get('cubin_bytes') if isinstance(meta, dict) else '?'}")
        if meta.get("cubin_sha256") != hashlib.sha256(cubin).hexdigest():
            return "kernel.cubin does not match its checksum"
        return Entry(path, cubin, meta)

    def _repair(self, path: Path, why: str) -> None:
        """Remove a damaged entry (the caller rebuilds it), with one warning per entry and process."""
        if str(path) not in _warned:
            _warned.add(str(path))
            warnings.warn(f"kernel cache entry {path} was damaged ({why}); removed, it is rebuilt",
                          CacheWarning, stacklevel=3)
        try:
            with self._writing():
                self._discard(path)
        except CacheError:
            pass  # a read-only cache: the entry stays a miss

    def get_or_build(self, key: str, build: Callable[[], tuple[bytes, str, dict]]) -> tuple[Entry, str]:
        """(entry, "cached" | "compiled"). `build` returns (cubin, source, extra meta)."""
        always = env.flag("KGEN_ALWAYS_COMPILE")
        if not always and (entry := self.lookup(key)):
            return entry, "cached"
        if env.flag("KGEN_DISABLE_JIT"):
            raise CacheMissError(f"not in {self.described}, and KGEN_DISABLE_JIT=1 forbids compiling")
        locks = self.root / "locks"
        with self._writing():
            locks.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(locks / f"{key}.lock"))
        try:
            lock.acquire()
        except OSError as e:
            raise self._unwritable(e) from None
        try:
            if not always and (entry := self.lookup(key)):
                return entry, "cached"
            cubin, source, extra = build()
            with self._writing():
                return self._store(key, cubin, source, extra), "compiled"
        finally:
            lock.release()

    def update_meta(self, entry: Entry, fields: dict) -> Entry:
        """Add derived facts (e.g. SASS counts) to an entry's meta.json, atomically; the cubin and
        its checksum are untouched. Best effort: an entry removed meanwhile is left alone."""
        meta = {**entry.meta, **fields}
        tmp = entry.path / f"meta.json.{os.getpid()}.{uuid.uuid4().hex}"
        try:
            tmp.write_text(json.dumps(meta, indent=2, sort_keys=True))
            os.replace(tmp, entry.path / "meta.json")
        except OSError:
            tmp.unlink(missing_ok=True)
        return Entry(entry.path, entry.cubin, meta)

    def _store(self, key: str, cubin: bytes, source: str, extra: dict) -> Entry:
        meta = {**extra, "key": key, "cubin_bytes": len(cubin),
                "cubin_sha256": hashlib.sha256(cubin).hexdigest()}
        tmp = self.root / "tmp" / f"{key[:16]}.{os.getpid()}.{uuid.uuid4().hex}"
        tmp.mkdir(parents=True)
        # meta.json is written last: it is the commit marker lookup() validates against.
        for name, data in (("kernel.cu", source.encode()), ("kernel.cubin", cubin),
                           ("meta.json", json.dumps(meta, indent=2, sort_keys=True).encode())):
            with open(tmp / name, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        final = self.entry_dir(key)
        final.parent.mkdir(parents=True, exist_ok=True)
        if final.exists():  # KGEN_ALWAYS_COMPILE, or a damaged entry: replace it
            self._discard(final)
        os.replace(tmp, final)
        return Entry(final, cubin, meta)

    def _discard(self, path: Path) -> None:
        # Rename first so a concurrent reader never sees a half-deleted entry.
        trash = self.root / "tmp" / f"trash.{os.getpid()}.{uuid.uuid4().hex}"
        trash.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(path, trash)
        except FileNotFoundError:
            return
        shutil.rmtree(trash, ignore_errors=True)

    def info(self) -> dict:
        """Entries and bytes; entries that a clear or a repair in another process removes meanwhile
        do not count."""
        count = size = 0
        for entry in self.entries.glob("*/*"):
            try:
                size += sum(f.stat().st_size for f in entry.iterdir() if f.is_file())
                count += 1
            except OSError:  # removed while we looked (or not a directory)
                continue
        return {"root": str(self.root), "schema": SCHEMA_VERSION, "entries": count, "bytes": size}

    def clear(self) -> int:
        """Remove every entry (and staging leftovers); waits for writes in flight, never breaks them."""
        if not self.root.exists():
            return 0
        with self._writing(exclusive=True):
            n = self.info()["entries"]
            self._discard(self.entries)
            shutil.rmtree(self.root / "tmp", ignore_errors=True)
        return n

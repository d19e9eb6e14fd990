"""Content-addressed cubin cache (DESIGN §7).

An entry is a directory <root>/v<schema>/<key[:2]>/<key>/ holding kernel.cu, kernel.cubin and
meta.json. It is built in a private temp dir, fsync'd, then renamed into place, so readers see
a whole entry or none. meta.json records the cubin's size and sha256: a truncated or corrupt
entry fails that check and is rebuilt. A per-key file lock makes N processes (8 TP ranks) that
miss at once compile each kernel once: the first builds, the others wait and then hit.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from filelock import FileLock

from . import env
from .version import __version__
from .errors import CacheMissError

SCHEMA_VERSION = 1


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

    def entry_dir(self, key: str) -> Path:
        return self.entries / key[:2] / key

    def lookup(self, key: str) -> Entry | None:
        """The entry for `key`, or None if absent; a damaged entry is removed and reported absent."""
        path = self.entry_dir(key)
        try:
            meta = json.loads((path / "meta.json").read_text())
            cubin = (path / "kernel.cubin").read_bytes()
        except FileNotFoundError:
            if path.exists():
                self._discard(path)
            return None
        except (OSError, ValueError):
            self._discard(path)
            return None
        if (not isinstance(meta, dict) or meta.get("cubin_bytes") != len(cubin)
                or meta.get("cubin_sha256") != hashlib.sha256(cubin).hexdigest()):
            self._discard(path)
            return None
        return Entry(path, cubin, meta)

    def get_or_build(self, key: str, build: Callable[[], tuple[bytes, str, dict]]) -> tuple[Entry, str]:
        """(entry, "cached" | "compiled"). `build` returns (cubin, source, extra meta)."""
        always = env.flag("KGEN_ALWAYS_COMPILE")
        if not always and (entry := self.lookup(key)):
            return entry, "cached"
        if env.flag("KGEN_DISABLE_JIT"):
            raise CacheMissError(f"kernel {key[:16]} is not in the cache at {self.root} and KGEN_DISABLE_JIT=1")
        locks = self.root / "locks"
        locks.mkdir(parents=True, exist_ok=True)
        with FileLock(str(locks / f"{key}.lock")):
            if not always and (entry := self.lookup(key)):
                return entry, "cached"
            cubin, source, extra = build()
            return self._store(key, cubin, source, extra), "compiled"

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
        entries = [p for p in self.entries.glob("*/*") if p.is_dir()] if self.entries.exists() else []
        size = sum(f.stat().st_size for p in entries for f in p.iterdir() if f.is_file())
        return {"root": str(self.root), "schema": SCHEMA_VERSION, "entries": len(entries), "bytes": size}

    def clear(self) -> int:
        n = self.info()["entries"]
        self._discard(self.entries)
        for sub in ("tmp", "locks"):
            shutil.rmtree(self.root / sub, ignore_errors=True)
        return n

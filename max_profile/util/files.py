"""Reading user files (plain or gzip) with clear refusals, and max_profile's cache folder.

Every reader of user input goes through :func:`read_input`: a missing file, a folder, an empty
file, a truncated or corrupt gzip and a file past the size limit each become one
:class:`~max_profile.errors.TraceFormatError` (or :class:`~max_profile.errors.InputError`) that
names the file.
"""

from __future__ import annotations

import gzip
import os
import zlib
from pathlib import Path

from max_profile.errors import InputError, TraceFormatError

GZIP_MAGIC = b"\x1f\x8b"
DEFAULT_LIMIT_BYTES = 4 << 30
"""Largest input read into memory (decompressed): 4 GiB. Bigger files are refused, not swapped in."""


def check_input_path(path: str | os.PathLike[str]) -> Path:
    """The path as a :class:`Path` when it names a readable, non-empty file; else an error naming it."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"{p}: file not found")
    if p.is_dir():
        raise InputError(f"{p}: is a folder; pass the file inside it")
    if p.stat().st_size == 0:
        raise TraceFormatError(f"{p}: file is empty")
    return p


def is_gzip(path: str | os.PathLike[str]) -> bool:
    with open(path, "rb") as fh:
        return fh.read(2) == GZIP_MAGIC


def read_input(path: str | os.PathLike[str], *, limit_bytes: int = DEFAULT_LIMIT_BYTES) -> bytes:
    """The file's bytes, gunzipped when it is gzip; bounded by ``limit_bytes`` (a gzip bomb stops there)."""
    p = check_input_path(path)
    if not is_gzip(p):
        size = p.stat().st_size
        if size > limit_bytes:
            raise TraceFormatError(f"{p}: {size / 2**30:.1f} GiB is more than max_profile reads ({limit_bytes / 2**30:.1f} GiB)")
        return p.read_bytes()
    out = bytearray()
    try:
        with gzip.open(p, "rb") as fh:
            while True:
                chunk = fh.read(1 << 20)
                if not chunk:
                    break
                out += chunk
                if len(out) > limit_bytes:
                    raise TraceFormatError(f"{p}: decompresses to more than {limit_bytes / 2**30:.1f} GiB (a gzip bomb?); refused")
    except (OSError, EOFError, zlib.error) as exc:
        raise TraceFormatError(f"{p}: truncated or corrupt gzip file ({exc})") from exc
    return bytes(out)


def read_head(path: str | os.PathLike[str], n: int = 4096) -> bytes:
    """The first ``n`` bytes (of the decompressed stream for gzip files)."""
    p = check_input_path(path)
    if not is_gzip(p):
        with open(p, "rb") as fh:
            return fh.read(n)
    try:
        with gzip.open(p, "rb") as fh:
            return fh.read(n)
    except (OSError, EOFError, zlib.error) as exc:
        raise TraceFormatError(f"{p}: truncated or corrupt gzip file ({exc})") from exc


def write_output(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` (gzip when the name ends in .gz) atomically: a failure leaves no partial file."""
    p = Path(path)
    if not p.parent.is_dir():
        raise InputError(f"{p}: the folder {p.parent} does not exist")
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    try:
        if p.name.endswith(".gz"):
            with gzip.open(tmp, "wb", compresslevel=6) as fh:
                fh.write(data)
        else:
            tmp.write_bytes(data)
        os.replace(tmp, p)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise InputError(f"{p}: cannot write ({exc.strerror or exc})") from exc
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def cache_dir(*parts: str) -> Path:
    """max_profile's cache folder (``$MAX_PROFILE_CACHE``, default ``~/.cache/max_profile``), created on use."""
    root = Path(os.environ.get("MAX_PROFILE_CACHE") or Path.home() / ".cache" / "max_profile")
    folder = root.joinpath(*parts)
    folder.mkdir(parents=True, exist_ok=True)
    return folder

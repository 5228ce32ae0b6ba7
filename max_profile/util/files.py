"""Reading user files (plain or gzip) with clear refusals, and max_profile's cache folder.

Every reader of user input goes through :func:`read_input`: a missing file, a folder, an empty
file, a truncated or corrupt gzip and a file past the size limit each become one
:class:`~max_profile.errors.TraceFormatError` (or :class:`~max_profile.errors.InputError`) that
names the file.
"""

from __future__ import annotations

import gzip
import os
import sqlite3
import zlib
from pathlib import Path

from max_profile.errors import InputError, TraceFormatError

GZIP_MAGIC = b"\x1f\x8b"
INPUT_LIMIT_ENV = "MAX_PROFILE_MAX_INPUT_MB"
ROW_LIMIT_ENV = "MAX_PROFILE_MAX_ROWS"
DEFAULT_INPUT_LIMIT_MB = 512
"""Largest text input (JSON, CSV, log) read into memory, decompressed: 512 MiB, so a gzip bomb or a
10 GB file stops well inside 1 GB of memory. ``MAX_PROFILE_MAX_INPUT_MB`` raises it."""
DEFAULT_ROW_LIMIT = 4_000_000
"""Most rows read from one table of an SQLite capture (kernels, launches): 4 million, about 1 GB of
analysis memory. ``MAX_PROFILE_MAX_ROWS`` raises it."""


def _env_limit(name: str, default: int) -> int:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        raise InputError(f"{name}={text!r}: expected a whole number") from None
    if value <= 0:
        raise InputError(f"{name}={text!r}: expected a positive number")
    return value


def input_limit_bytes() -> int:
    """The text-input size limit in bytes (``$MAX_PROFILE_MAX_INPUT_MB``, default 512 MiB)."""
    return _env_limit(INPUT_LIMIT_ENV, DEFAULT_INPUT_LIMIT_MB) << 20


def row_limit() -> int:
    """The per-table row limit for SQLite captures (``$MAX_PROFILE_MAX_ROWS``, default 4,000,000)."""
    return _env_limit(ROW_LIMIT_ENV, DEFAULT_ROW_LIMIT)


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


SQLITE_ERRORS = (sqlite3.DatabaseError, UnicodeDecodeError)
"""What a damaged SQLite file raises: a database error, or (Python's sqlite3 decoding SQLite's own error
message, which quotes the damaged schema) a UnicodeDecodeError."""

SQLITE_MAGIC = b"SQLite format 3\x00"
"""The first 16 bytes of every SQLite database file."""


def open_sqlite_readonly(path: str | os.PathLike[str]) -> sqlite3.Connection:
    """A read-only connection to a user's SQLite file (nsys export, rocpd database).

    Text cells that are not valid UTF-8 (a damaged or foreign database) come back with U+FFFD in place of
    the bad bytes instead of failing the whole read; the path is passed as a ``file:`` URI so names with
    ``?`` or ``#`` work. Equivalent: ``sqlite3 -readonly FILE``.
    """
    con = sqlite3.connect(Path(path).resolve().as_uri() + "?mode=ro", uri=True, check_same_thread=False)
    con.text_factory = lambda raw: raw.decode("utf-8", errors="replace")
    return con


def is_gzip(path: str | os.PathLike[str]) -> bool:
    with open(path, "rb") as fh:
        return fh.read(2) == GZIP_MAGIC


def read_input(path: str | os.PathLike[str], *, limit_bytes: int | None = None) -> bytes:
    """The file's bytes, gunzipped when it is gzip; bounded by ``limit_bytes`` (default
    :func:`input_limit_bytes`): a bigger file is refused before it is read, a gzip bomb when its output
    passes the limit. Gzip output is returned as the bytearray it was read into (no second copy)."""
    p = check_input_path(path)
    limit = input_limit_bytes() if limit_bytes is None else limit_bytes
    hint = f"; set {INPUT_LIMIT_ENV}=N (MiB) to read bigger inputs" if limit_bytes is None else ""
    if not is_gzip(p):
        size = p.stat().st_size
        if size > limit:
            raise TraceFormatError(
                f"{p}: {_size(size)} is more than the {_size(limit)} max_profile reads into memory{hint}"
            )
        return p.read_bytes()
    out = bytearray()
    try:
        with gzip.open(p, "rb") as fh:
            while True:
                chunk = fh.read(1 << 20)
                if not chunk:
                    break
                out += chunk
                if len(out) > limit:
                    raise TraceFormatError(
                        f"{p}: decompresses to more than {_size(limit)} (a gzip bomb, or a capture too big to read "
                        f"whole){hint}"
                    )
    except (OSError, EOFError, zlib.error) as exc:
        raise TraceFormatError(f"{p}: truncated or corrupt gzip file ({exc})") from exc
    return out  # type: ignore[return-value]  # a bytearray reads like bytes everywhere it is used


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


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
        _remove_quietly(tmp)
        raise InputError(f"{p}: cannot write ({exc.strerror or exc})") from exc
    except BaseException:
        _remove_quietly(tmp)
        raise


def _remove_quietly(path: Path) -> None:
    """Remove a temporary file on an error path; a failure here (a read-only folder refuses even that) must not mask
    the first error."""
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass


def cache_dir(*parts: str) -> Path:
    """max_profile's cache folder (``$MAX_PROFILE_CACHE``, default ``~/.cache/max_profile``), created on use."""
    root = Path(os.environ.get("MAX_PROFILE_CACHE") or Path.home() / ".cache" / "max_profile")
    folder = root.joinpath(*parts)
    folder.mkdir(parents=True, exist_ok=True)
    return folder

"""Secrets in the settings: password files (read once, refused when others may read them) and paths.

Passwords are held as :class:`~pydantic.SecretStr`, so that no ``repr``, ``str`` or
error message shows them; :func:`read_password_file` is the one reader of password
files, for the settings and for the command line's ``--password-file``.
"""

from __future__ import annotations

import stat
from pathlib import Path

__all__ = ["expand_path", "read_password_file"]


def expand_path(value: object) -> object:
    """``~`` expanded in a path given as a string or a :class:`~pathlib.Path`; other values as they are."""
    if isinstance(value, str) and value:
        return Path(value).expanduser()
    if isinstance(value, Path):
        return value.expanduser()
    return value


def read_password_file(path: Path) -> str:
    """The password in ``path`` (without its trailing newline); refuses files others may read.

    Raises :class:`ValueError` naming the file and the problem (missing, not a regular
    file, readable by group or others, not UTF-8, empty); never the content.
    """
    try:
        info = path.stat()
    except FileNotFoundError:
        raise ValueError(f"password file {path} does not exist") from None
    except OSError as exc:
        raise ValueError(f"password file {path} cannot be read: {exc.strerror or exc}") from None
    if not stat.S_ISREG(info.st_mode):
        raise ValueError(f"password file {path} is not a regular file")
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077:
        raise ValueError(f"password file {path} is readable by others (mode {mode:04o}); chmod 600 it")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"password file {path} cannot be read: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"password file {path} is not UTF-8 text") from None
    password = text.rstrip("\r\n")
    if not password:
        raise ValueError(f"password file {path} is empty")
    return password

"""Where ``kvmesh serve`` leaves its router's admin key for the operator's commands on the same machine.

``kvmesh serve`` generates a fresh admin key per run (tenants never hold it) and writes it to
``~/.cache/kvmesh/admin_key`` (``$XDG_CACHE_HOME`` respected; ``KVMESH_ADMIN_KEY_FILE`` overrides),
readable by its user only (mode 0600, in a 0700 folder). ``kvmesh scale/drain/rollout`` read it
from there unless ``KVMESH_ADMIN_KEY`` or ``--admin-key-file`` says otherwise.
"""

from __future__ import annotations

import os
from pathlib import Path


def default_admin_key_file() -> Path:
    override = os.environ.get("KVMESH_ADMIN_KEY_FILE")
    if override:
        return Path(override)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "kvmesh" / "admin_key"


def write_admin_key(path: str | os.PathLike, key: str) -> Path:
    """Write the key readable by this user only (an existing file is replaced, never widened)."""
    path = Path(path)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key + "\n")
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return path


def read_admin_key(path: str | os.PathLike | None = None) -> str:
    """``KVMESH_ADMIN_KEY``, else the file; ValueError saying where it looked and what to do."""
    key = os.environ.get("KVMESH_ADMIN_KEY")
    if key:
        return key
    path = Path(path) if path else default_admin_key_file()
    try:
        mode = path.stat().st_mode & 0o077
        if mode:
            raise ValueError(f"{path} is readable by other users (mode {oct(path.stat().st_mode & 0o777)}); "
                             f"run `chmod 600 {path}` or restart `kvmesh serve`, which writes it 0600")
        key = path.read_text().strip()
    except FileNotFoundError:
        raise ValueError(f"no admin key at {path}: is `kvmesh serve` running as this user on this machine? "
                         "Set KVMESH_ADMIN_KEY or --admin-key-file otherwise") from None
    if not key:
        raise ValueError(f"{path} is empty; restart `kvmesh serve` or set KVMESH_ADMIN_KEY")
    return key

"""Where each ``kvmesh serve`` leaves its router's admin key for the operator's commands on the same machine.

Every running cluster has its own record, ``~/.cache/kvmesh/clusters/<host>_<port>.json``
(``$XDG_CACHE_HOME`` respected; ``KVMESH_CLUSTERS_DIR`` overrides the folder): the router's URL, the
serve process's pid and host name, the admin key and the tenants' API key when the router checks one,
readable by its user only (mode 0600, in a 0700 folder), and what another router needs to stand in front of its
replicas (``RouterSecrets``: the internal key, the event streams' CURVE keys; ``kvmesh bench compare-policies``).
A cluster's record is written once its router listens, is never replaced while the process that wrote it lives,
and is removed when that cluster stops.

``kvmesh scale/drain/rollout`` find the key: ``KVMESH_ADMIN_KEY``, else ``--admin-key-file`` (a
record, or a file holding just the key), else the record of the cluster at ``--url``, else -- with no
``--url`` -- the one running cluster's record (several: an error listing them and how to pick one).
``kvmesh status`` finds the API key the same way (``--api-key``, else ``KVMESH_API_KEY``, else the record).
A URL names the same router however its loopback host is spelled (``localhost``, ``127.0.0.1``, ``[::1]``).
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from kvmesh.router.config import RouterConfig

LOOPBACK_NAMES = frozenset({"localhost", "::1", "ip6-localhost"})
"""Host names of this machine's loopback interface besides 127.0.0.0/8 (the router binds 127.0.0.1)."""


@dataclass(frozen=True)
class RouterSecrets:
    """What a second router needs to stand in front of a running cluster's replicas besides its own config (a
    ``kvmesh bench compare-policies`` router): the replicas take tenants' calls only from their router and publish
    their events to it only. Kept in the cluster's record, which only its user can read (as the admin key). SECRET."""

    internal_key: str | None = field(default=None, repr=False)
    """The cluster's internal key (the replicas' only key)."""
    cache_salt_secret: str | None = field(default=None, repr=False)
    """Hex of the key of the replicas' cache-salt digests (so a salted request matches their blocks)."""
    curve_server_key: str | None = None
    """The replicas' CURVE public key (private event streams); None: their events are plain."""
    curve_public_key: str | None = None
    """The router's CURVE public key, the one subscriber the replicas admit."""
    curve_secret_key: str | None = field(default=None, repr=False)
    """Its secret key."""
    block_size: int | None = None
    """The replicas' KV block size."""

    @classmethod
    def of(cls, router: RouterConfig) -> RouterSecrets:
        """The secrets of the cluster's own router ``router``."""
        ev = router.events
        salt = router.cache_salt_secret
        return cls(router.internal_key, salt.hex() if salt is not None else None, ev.curve_server_key,
                   ev.curve_public_key, ev.curve_secret_key, router.block_size)

    def apply(self, router: RouterConfig) -> RouterConfig:
        """``router`` able to reach the cluster's replicas and read their event streams."""
        events = replace(router.events, curve_server_key=self.curve_server_key,
                         curve_public_key=self.curve_public_key, curve_secret_key=self.curve_secret_key)
        salt = bytes.fromhex(self.cache_salt_secret) if self.cache_salt_secret is not None else None
        return replace(router, internal_key=self.internal_key, cache_salt_secret=salt, events=events,
                       block_size=self.block_size or router.block_size)


@dataclass(frozen=True)
class ClusterRecord:
    """One running ``kvmesh serve``: where its router listens and the key that changes its replica set."""

    url: str
    pid: int
    host: str
    admin_key: str = field(repr=False)
    path: Path = field(default=Path())
    api_key: str | None = field(default=None, repr=False)
    """The tenants' key the router checks (``kvmesh status`` reads ``/replicas`` with it); None: none."""
    started: str | None = None
    """The serve process's start time (/proc), so a reused pid is not taken for it."""
    router_secrets: RouterSecrets | None = field(default=None, repr=False)
    """What another router needs to stand in front of its replicas; None: not recorded."""

    def alive(self) -> bool:
        """The serve process that wrote the record still runs (on this machine)."""
        if self.host != socket.gethostname() or not _pid_alive(self.pid):
            return False
        return self.started is None or _started(self.pid) in (None, self.started)


def clusters_dir() -> Path:
    override = os.environ.get("KVMESH_CLUSTERS_DIR")
    if override:
        return Path(override)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "kvmesh" / "clusters"


def record_path(url: str, folder: str | os.PathLike | None = None) -> Path:
    parts = urlsplit(url)
    return Path(folder or clusters_dir()) / f"{parts.hostname}_{parts.port}.json"


def same_router(url: str) -> str:
    """``url`` as a record names it: scheme, host and port, a loopback host as 127.0.0.1, no trailing slash."""
    parts = urlsplit(url.rstrip("/") if "://" in url else f"http://{url}")
    host = (parts.hostname or "").lower()
    if host in LOOPBACK_NAMES or host.startswith("127."):
        host = "127.0.0.1"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.scheme or 'http'}://{host}:{port}{parts.path.rstrip('/')}"


def publish(url: str, key: str, folder: str | os.PathLike | None = None, api_key: str | None = None,
            router_secrets: RouterSecrets | None = None) -> Path:
    """Write this process's record for the router at ``url`` (with the tenants' ``api_key``, if the router
    checks one, and the ``router_secrets`` another router needs); refuses to replace a live cluster's."""
    path = record_path(url, folder)
    current = _load(path)
    if current is not None and current.alive() and current.pid != os.getpid():
        raise RuntimeError(f"{path} belongs to the running kvmesh serve (pid {current.pid}) at {current.url}; "
                           "stop it first, or serve this cluster on another --port")
    body = json.dumps({"url": url.rstrip("/"), "pid": os.getpid(), "host": socket.gethostname(),
                       "started": _started(os.getpid()), "admin_key": key,
                       **({"api_key": api_key} if api_key else {}),
                       **({"router_secrets": asdict(router_secrets)} if router_secrets is not None else {})})
    return write_private(path, body)


def withdraw(path: str | os.PathLike | None) -> None:
    """Remove this process's record (a record another process wrote is left alone)."""
    if path is None:
        return
    current = _load(Path(path))
    if current is not None and current.pid == os.getpid():
        Path(path).unlink(missing_ok=True)


def write_private(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` readable by this user only (an existing file is replaced, never widened)."""
    path = Path(path)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text + "\n")
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return path


def running_clusters(folder: str | os.PathLike | None = None) -> list[ClusterRecord]:
    """Records of the clusters still running on this machine, by URL (records of dead ones are removed)."""
    folder = Path(folder or clusters_dir())
    found = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        record = _load(path)
        if record is None:
            continue
        if record.alive():
            found.append(record)
        elif record.host == socket.gethostname():
            path.unlink(missing_ok=True)  # its serve was killed before it could remove it
    return found


def find_admin_key(url: str | None, key_file: str | None = None,
                   folder: str | os.PathLike | None = None) -> tuple[str, str]:
    """(router URL, admin key) for an operator command; ValueError saying what was found and what to do."""
    default_url = "http://127.0.0.1:8000"
    key = os.environ.get("KVMESH_ADMIN_KEY")
    if key:
        return url or default_url, key
    if key_file:
        record = _load(Path(key_file), strict=True)
        return url or (record.url if record and record.url else default_url), record.admin_key
    running = running_clusters(folder)
    where = Path(folder or clusters_dir())
    if url is not None:
        wanted = url.rstrip("/")
        match = [r for r in running if same_router(r.url) == same_router(wanted)]
        if match:
            return match[0].url, match[0].admin_key
        listed = "; running here: " + ", ".join(r.url for r in running) if running else ""
        raise ValueError(f"no running kvmesh serve with its router at {wanted} has a key in {where}{listed}. "
                         "Set KVMESH_ADMIN_KEY or --admin-key-file for a cluster started elsewhere")
    if not running:
        raise ValueError(f"no running kvmesh serve found (no cluster record in {where}): is it running as this "
                         "user on this machine? Set KVMESH_ADMIN_KEY or --admin-key-file otherwise")
    if len(running) > 1:
        raise ValueError(f"{len(running)} kvmesh clusters run here: "
                         + ", ".join(f"{r.url} (pid {r.pid})" for r in running)
                         + "; pick one with --url, e.g. --url " + running[0].url)
    return running[0].url, running[0].admin_key


def running_record(url: str, folder: str | os.PathLike | None = None) -> ClusterRecord | None:
    """The record of the cluster running here with its router at ``url``; None: none."""
    return next((r for r in running_clusters(folder) if same_router(r.url) == same_router(url)), None)


def _load(path: Path, strict: bool = False) -> ClusterRecord | None:
    """A record (or, with ``strict``, a plain key file); None where there is none or it is unreadable."""
    try:
        mode = path.stat().st_mode & 0o777
        text = path.read_text().strip()
    except FileNotFoundError:
        if strict:
            raise ValueError(f"no admin key at {path}; set KVMESH_ADMIN_KEY or point --admin-key-file at the "
                             "record `kvmesh serve` printed") from None
        return None
    if mode & 0o077:
        if strict:
            raise ValueError(f"{path} is readable by other users (mode {oct(mode)}); run `chmod 600 {path}`")
        return None  # not one serve wrote
    try:
        data = json.loads(text)
        return ClusterRecord(url=str(data["url"]), pid=int(data["pid"]), host=str(data["host"]),
                             admin_key=str(data["admin_key"]), path=path,
                             started=data.get("started"), api_key=data.get("api_key"),
                             router_secrets=RouterSecrets(**data["router_secrets"]) if "router_secrets" in data
                             else None)
    except (ValueError, KeyError, TypeError):
        if strict and text and "\n" not in text and not text.startswith("{"):
            return ClusterRecord(url="", pid=0, host="", admin_key=text, path=path)  # a file holding just the key
        if strict:
            raise ValueError(f"{path} holds neither a cluster record nor an admin key") from None
        return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: not ours to judge, keep its record
    return True


def _started(pid: int) -> str | None:
    """A process's start time in clock ticks since boot (Linux), None where /proc has none."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None

"""API keys for ``kvmesh bench overload``'s tenants: which Bearer key each tenant (by its ``user`` name) sends.

Optional: without keys a tenant is named by the request's ``user`` field alone. ``--tenant-key USER=KEY``
(repeatable) names one; ``--keys-file`` reads YAML or JSON, either a mapping ``{user: key}`` or the router's kind
of keys file, a list (or ``{"keys": [...]}``) of entries with ``key`` and ``tenant`` (or ``name``): the first key
listed for a tenant is the one sent.
"""

from __future__ import annotations

from pathlib import Path


def load_tenant_keys(pairs: list[str], keys_file: str | None) -> dict[str, str]:
    """{tenant user name: API key}; raises ValueError naming what is wrong with the input."""
    keys: dict[str, str] = {}
    if keys_file:
        keys.update(_from_file(Path(keys_file)))
    for pair in pairs:
        user, sep, key = pair.partition("=")
        if not sep or not user or not key:
            raise ValueError(f"--tenant-key {pair!r}: expected USER=KEY")
        keys[user] = key
    return keys


def _from_file(path: Path) -> dict[str, str]:
    import yaml

    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ValueError(f"--keys-file {path}: {e}") from None
    if isinstance(doc, dict) and "keys" in doc:
        doc = doc["keys"]
    if isinstance(doc, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in doc.items()):
        return dict(doc)
    if not isinstance(doc, list):
        raise ValueError(f"--keys-file {path}: expected a mapping user: key or a list of {{key, tenant}} entries")
    keys: dict[str, str] = {}
    for i, entry in enumerate(doc):
        tenant = entry.get("tenant", entry.get("name")) if isinstance(entry, dict) else None
        if not isinstance(tenant, str) or not isinstance(entry.get("key"), str):
            raise ValueError(f"--keys-file {path}: entry {i} needs a string key and tenant (or name)")
        keys.setdefault(tenant, entry["key"])
    return keys

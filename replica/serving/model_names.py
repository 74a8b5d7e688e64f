"""The names a model answers to: the one naming rule of replicas and the router.

A model given by name (``served_model_name``, a hub id) answers to that name. A model given as a path answers
to the path as given, its absolute form and its resolved form (symbolic links followed) alike, so a client, a
router and a replica that reach the same directory by different routes -- a relative path, an absolute one, one
through a symbolic link -- agree on it::

    model_aliases("stories260K/hf")   # cwd /work/shared/models, /work/shared -> /data/shared
    -> ("stories260K/hf", "/work/shared/models/stories260K/hf", "/data/shared/models/stories260K/hf")

A requested name that is none of them is resolved the same way before it is refused (``names_model``): the path a
request gives through another link to the same directory names the same model.
"""

from __future__ import annotations

import os
from collections.abc import Collection

from kvmesh.replica.serving.errors import ProtocolError, echo


def looks_like_path(name: str) -> bool:
    """A name that may be a filesystem path: it has a separator or starts like one (``.``, ``~``)."""
    return "/" in name or name.startswith((".", "~")) or (os.sep != "/" and os.sep in name)


def path_forms(name: str) -> tuple[str, ...]:
    """``name``, and when it may be a path, its absolute and resolved forms (each once, in that order)."""
    forms = [name]
    if looks_like_path(name) and "\0" not in name:
        try:
            expanded = os.path.expanduser(name)
            forms += [os.path.abspath(expanded), os.path.realpath(expanded)]
        except (OSError, ValueError):  # a name no filesystem call can take: only the name itself
            pass
    return tuple(dict.fromkeys(forms))


def model_aliases(*names: str | None) -> tuple[str, ...]:
    """Every name the model given as ``names`` answers to (the first is the served name): each name as given,
    and the absolute and resolved forms of those that may be paths; without repeats, in order."""
    found: dict[str, None] = {}
    for name in names:
        if name:
            found.update(dict.fromkeys(path_forms(name)))
    return tuple(found)


def split_served_names(value: str | list[str] | tuple[str, ...] | None, aliases: tuple[str, ...],
                       field: str) -> tuple[str | None, tuple[str, ...]]:
    """``served_model_name`` as a config holds it -> (the served name, the model's other names). vLLM takes several
    names (``--served-model-name a b``): the first is the one answers report, every one is accepted as the model."""
    if not isinstance(value, (list, tuple)):
        return value, tuple(aliases)
    if not value or not all(isinstance(name, str) and name for name in value):
        raise ValueError(f"{field}: expected one or more non-empty names, got {value!r}")
    first, *others = value
    return first, tuple(name for name in dict.fromkeys([*others, *aliases]) if name != first)


def find_model(requested: str, names: Collection[str]) -> str | None:
    """The one of ``names`` (e.g. a model's ``model_aliases``) that ``requested`` names: itself, or the absolute
    or resolved form of the path it gives (another route to the same directory); None when it names none."""
    if requested in names:
        return requested
    if looks_like_path(requested):
        for form in path_forms(requested)[1:]:
            if form in names:
                return form
    return None


def names_model(requested: str, names: Collection[str]) -> bool:
    """Whether ``requested`` names the model whose ``model_aliases`` are ``names`` (``find_model``)."""
    return find_model(requested, names) is not None


def check_model(model: str | None, served: str, aliases: Collection[str] = ()) -> None:
    """A 404 (vLLM's) for a request naming a model other than ``served`` or one of its ``aliases`` (e.g.
    ``model_aliases(served, path)``; a path also by its resolved form: ``names_model``)."""
    if model is not None and model != served and not names_model(model, aliases):
        raise ProtocolError(f"The model `{echo(model)}` does not exist; this server serves `{served}` (see "
                            "/v1/models).",
                            404, param="model")

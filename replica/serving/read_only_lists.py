"""Token lists that stay what ``SamplingParams.validate`` checked: its ``stop_token_ids``, ``allowed_token_ids``
(``TokenIds``) and ``logit_bias`` (``TokenBias``) are read-only copies, made once per request when they are checked.

The lists are checked once and shared by the n children of a request (and by the rows of the runner's batch:
sample/token_lists.py), so a caller that changed one in place would reach the step with unchecked ids (an id outside
the vocabulary fails every request of the step). They read as the list and dict they are (equal to them, JSON,
pickle, ``copy``); changing one raises TypeError saying to assign a new one, which is checked again."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

__all__ = ["TokenBias", "TokenIds", "read_only_bias", "read_only_ids"]


def _refuse(self, *args, **kwargs):
    raise TypeError(f"{self._field} is read-only once its SamplingParams are checked (the engine and the n children of "
                    f"a request share it); assign a new {type(self).__mro__[1].__name__} to the field instead")


class TokenIds(list):
    """A read-only list of token ids (no duplicates)."""

    _field = "stop_token_ids / allowed_token_ids"
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse
    append = extend = insert = pop = remove = clear = sort = reverse = _refuse

    def __reduce__(self):
        return TokenIds, (list(self),)

    def __copy__(self) -> TokenIds:
        return self  # nothing can change it: a copy may share it

    def __deepcopy__(self, memo) -> TokenIds:
        return self


class TokenBias(dict):
    """A read-only token id -> bias mapping."""

    _field = "logit_bias"
    __setitem__ = __delitem__ = __ior__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse

    def __reduce__(self):
        return TokenBias, (dict(self),)

    def __copy__(self) -> TokenBias:
        return self

    def __deepcopy__(self, memo) -> TokenBias:
        return self


def read_only_ids(ids: Iterable[int]) -> TokenIds | tuple[int, ...]:
    """``ids`` without repeats, read-only (itself when it already is, a TokenIds or a tuple: shared, not copied)."""
    if isinstance(ids, TokenIds) or isinstance(ids, tuple) and len(set(ids)) == len(ids):
        return ids
    return TokenIds(dict.fromkeys(ids))


def read_only_bias(bias: Mapping[int, float]) -> TokenBias:
    """``bias`` read-only (itself when it already is)."""
    return bias if isinstance(bias, TokenBias) else TokenBias(bias)

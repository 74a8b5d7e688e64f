"""Chat templates rendered as transformers renders them, without its per-call overhead.

``PreTrainedTokenizerBase.apply_chat_template(tokenize=False)`` compiles a template once (cached) in a
sandbox and then, per call, rebuilds every input out of plain JSON types, drops ``None`` message fields,
aliases reasoning fields, and renders with ``messages``, ``tools``, ``documents``, ``add_generation_prompt``
and the tokenizer's ``special_tokens_map`` (``bos_token``, ``eos_token``, ...) plus any extra kwargs. The
requests' messages are already plain dicts of strings (chat_message.ChatMessage.to_template_dict), so this
module skips the rebuilding and renders a template compiled in an environment set up like transformers'
(transformers 4.4x-5.x, utils/chat_template_utils.py): ``ImmutableSandboxedEnvironment`` with
``trim_blocks``/``lstrip_blocks`` and the ``loopcontrols`` extension, ``{% generation %}`` blocks rendered
as their body, the ``tojson`` filter (no HTML escaping, ``ensure_ascii=False``), and the globals
``raise_exception``, ``strftime_now``, ``dict`` and ``namespace`` (no underscore names).
tests/replica/test_chat_template.py checks the output against transformers' over real templates.
"""

from __future__ import annotations

import functools
import json
from datetime import datetime

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment
from kvmesh.replica.serving.json_types import JSONObject

_STR_METHODS = frozenset(name for name in dir(str) if not name.startswith("_")) - {"format", "format_map"}
"""``str``'s public methods but the two jinja2's sandbox wraps (``_Sandbox.getattr``, ``_Sandbox.call``)."""
_BUILTIN_METHOD = type("".strip)
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
"""Message fields transformers aliases to one another; messages with any of them are rendered by transformers."""


class _Generation(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}``: the body (transformers tracks its offsets only on request)."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    @staticmethod
    def _body(caller):
        return caller()


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format):  # noqa: A002 - the name templates call it with
    return datetime.now().strftime(format)


class _TemplateDict:
    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    def __init__(*args, **kwargs):
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"Chat templates cannot store underscore-prefixed attributes on a namespace, but got {name!r}. "
                "Please rename the attribute.")


class _Sandbox(ImmutableSandboxedEnvironment):
    """transformers' sandbox, its verdicts on attributes remembered: jinja2's ``is_safe_attribute`` (underscore
    names, internal attributes of functions/frames/..., methods that modify known mutable types) depends on the
    object's type and the name only, and asking is most of what rendering a chat costs."""

    _MAX_VERDICTS = 4096

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._verdicts: dict[tuple[type, str], bool] = {}

    def getattr(self, obj: object, attribute: str) -> object:
        """jinja2's answer, directly for a ``str`` method other than the two it wraps (``format``, ``format_map``):
        safe by its rules (public, of an immutable type), what ``content.strip()`` in every chat template asks."""
        if obj.__class__ is str and attribute in _STR_METHODS:
            return getattr(obj, attribute)
        return super().getattr(obj, attribute)

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 - jinja2's names, kept for its keywords
        """jinja2's call, directly for a bound ``str`` method (no ``unsafe_callable``/``alters_data``, takes no
        context: jinja2 would call it as it is, less its loop and block variables)."""
        if __obj.__class__ is _BUILTIN_METHOD and __obj.__self__.__class__ is str and __obj.__name__ in _STR_METHODS:
            kwargs.pop("_block_vars", None)
            kwargs.pop("_loop_vars", None)
            return __obj(*args, **kwargs)
        return super().call(__context, __obj, *args, **kwargs)

    def is_safe_attribute(self, obj: object, attr: str, value: object) -> bool:
        key = (type(obj), attr)
        verdict = self._verdicts.get(key)
        if verdict is None:
            verdict = super().is_safe_attribute(obj, attr, value)
            if len(self._verdicts) < self._MAX_VERDICTS:
                self._verdicts[key] = verdict
        return verdict


@functools.lru_cache(maxsize=16)
def compile_template(source: str) -> jinja2.Template:
    """``source`` compiled once in transformers' chat-template environment."""
    env = _Sandbox(trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    template = env.from_string(source)
    template.plain_globals = dict(template.globals)  # what Template.render merges per call, merged once
    return template


def plain(messages: list[JSONObject]) -> bool:
    """Whether ``messages`` are what ``render`` takes as transformers would: dicts of str (no ``None``), none
    with a reasoning field."""
    for m in messages:
        if m.__class__ is not dict:
            return False
        for key, value in m.items():
            if key.__class__ is not str or value.__class__ is not str or key in _REASONING_FIELDS:
                return False
    return True


def render(source: str, messages: list[dict[str, str]], add_generation_prompt: bool,
           special_tokens: dict[str, str | list[str]], template_kwargs: dict | None = None) -> str:
    """The chat as transformers' ``apply_chat_template(messages, chat_template=source, tokenize=False,
    add_generation_prompt=..., **template_kwargs)`` renders it, for ``plain`` messages; ``special_tokens`` is the
    tokenizer's ``special_tokens_map``. Raises what the template raises (jinja2 errors)."""
    template = compile_template(source)
    variables = {**template.plain_globals, **special_tokens, "messages": messages, "tools": None, "documents": None,
                 "add_generation_prompt": add_generation_prompt, **(template_kwargs or {})}
    try:  # Template.render, without re-merging the globals (a ChainMap) into every call's context
        return template.environment.concat(template.root_render_func(template.new_context(variables, shared=True)))
    except Exception:
        template.environment.handle_exception()

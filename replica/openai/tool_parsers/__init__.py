"""Tool-call parsers: read a model's tool calls out of its generated text (vLLM's ``--tool-call-parser``).

A parser is one file with a class that has a ``name`` and ``parse`` (base.py); adding one is that file and one
line in ``TOOL_PARSERS``. forced.py reads the output of ``tool_choice: "required"`` and of a named function.
"""

from __future__ import annotations

from kvmesh.replica.openai.tool_parsers.base import ToolParser
from kvmesh.replica.openai.tool_parsers.hermes import HermesToolParser
from kvmesh.replica.openai.tool_parsers.llama3_json import Llama3JsonToolParser

TOOL_PARSERS: dict[str, type[ToolParser]] = {
    HermesToolParser.name: HermesToolParser,
    Llama3JsonToolParser.name: Llama3JsonToolParser,
}
"""``--tool-call-parser`` values -> parser classes."""

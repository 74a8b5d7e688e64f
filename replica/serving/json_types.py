"""Named aliases for the JSON that is truly unstructured (chat messages, content parts, tools, error bodies)."""

from __future__ import annotations

from typing import Any

JSONObject = dict[str, Any]
"""A JSON object whose keys and values the code does not fix (OpenAI's ``tools``, ``response_format``, content
parts, a chat message as a template reads it): the one place the serving core says ``Any``."""

"""The shipped config docs are the real defaults: deploy/serve.example.yaml and the reference table of
docs/configuration.md are what the code generates from the dataclasses, and the example loads back to the defaults."""

from __future__ import annotations

from pathlib import Path

from kvmesh.cluster.commands.serve import EXAMPLE_HEADER
from kvmesh.cluster.config.loader import load, load_config
from kvmesh.cluster.config.reference import commented_yaml, markdown_table
from kvmesh.cluster.config.trees import SERVE_SCHEMA, ServeConfig

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / "serve.example.yaml"
REGENERATE = ("regenerate: env -u KVMESH_API_KEY -u KVMESH_HASH_SEED .venv/bin/kvmesh serve --print-config > "
              + str(EXAMPLE))


def test_serve_example_yaml_is_the_generated_defaults():
    expected = commented_yaml(SERVE_SCHEMA, load(SERVE_SCHEMA, env={}), header=EXAMPLE_HEADER)
    assert EXAMPLE.read_text() == expected, REGENERATE


def test_serve_example_yaml_loads_back_to_the_defaults():
    assert load_config(EXAMPLE, env={}) == ServeConfig()


def test_every_field_has_a_doc_line():
    assert all(opt.doc for opt in SERVE_SCHEMA.options), [o.dotted for o in SERVE_SCHEMA.options if not o.doc]


def test_configuration_reference_is_the_generated_table():
    text = (ROOT / "docs" / "configuration.md").read_text()
    start = text.index("<!-- config-reference")
    block = text[text.index("\n", start) + 1:text.index("<!-- /config-reference -->")]
    assert block == markdown_table(SERVE_SCHEMA), (
        "regenerate: paste the output of .venv/bin/python -m kvmesh.cluster.config.reference between the markers")

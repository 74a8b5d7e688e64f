"""The config's reference documents, generated from the schema (schema.py): the commented YAML of
``kvmesh serve --print-config`` (deploy/serve.example.yaml) and the Markdown table of every option in
docs/configuration.md (``python -m kvmesh.cluster.config.reference`` prints it, to paste between the markers).
Tests compare both with the shipped files (tests/cluster/test_config_docs.py).
"""

from __future__ import annotations

import yaml
from kvmesh.cluster.config.schema import Root, Schema, field_docs, to_dict


def commented_yaml(schema: Schema[Root], config: Root, header: str = "") -> str:
    """The config as YAML with each field's doc line above it (secrets redacted, hidden fields left out)."""
    values = to_dict(config)
    lines = [header.rstrip()] if header else []
    root_docs = field_docs(schema.root)
    for section in schema.sections:
        lines += ["", f"# {root_docs.get(section, '')}", f"{section}:"]
        section_docs, sub = field_docs(schema.sections[section]), ""
        for opt in (o for o in schema.options if o.section == section):
            if opt.sub != sub:
                sub = opt.sub
                lines += [f"  # {section_docs.get(sub, '')}", f"  {sub}:"] if sub else []
            indent = "    " if opt.sub else "  "
            env = " or ".join(opt.envs)
            lines.append(f"{indent}# {opt.doc}" + (f" Secret: prefer {env}." if opt.secret else ""))
            dumped = yaml.safe_dump({opt.name: opt.value_in(values)}, default_flow_style=True, sort_keys=False,
                                    width=1000)
            lines.append(indent + dumped.strip()[1:-1].strip())
    return "\n".join(lines).lstrip("\n") + "\n"


def markdown_table(schema: Schema) -> str:
    """A Markdown reference of every option: YAML key, flag, environment variable, default, doc."""
    defaults = schema.section_defaults()
    rows = ["| key | flag | default | meaning |", "|---|---|---|---|"]
    for opt in schema.options:
        default = "" if opt.secret else yaml.safe_dump(opt.value_in(defaults), default_flow_style=True,
                                                       width=1000).strip().removesuffix("...").strip()
        flag = f"`{opt.flag}`" if opt.on_cli else "(env/file only)"
        doc = opt.doc.replace("|", "\\|")
        rows.append(f"| `{opt.dotted}` | {flag} | `{default}` | {doc} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    from kvmesh.cluster.config.trees import SERVE_SCHEMA

    print(markdown_table(SERVE_SCHEMA), end="")

"""The run as a Markdown table, the shape of the GPU notes' table (gpu-first-contact.md), printed at the end."""

from __future__ import annotations


def _decode(rows: list[dict]) -> str:
    return " / ".join(f"{r['wall_ms_per_step']:.2f}" if "wall_ms_per_step" in r else "-" for r in rows)


def summary_table(results: dict) -> str:
    configs = results["configs"]
    batches = next((" / ".join(str(r["running_seqs"]) for r in c["decode"]) for c in configs if "decode" in c), "")
    prefix = next((c["ttft"]["prefix_len"] for c in configs if "ttft" in c), 0)
    lines = [f"| configuration | output tok/s | total tok/s | CPU ms per output token | decode ms/step @{batches} "
             f"| TTFT {prefix}+16 cold / prefix cached (ms) |", "|---|---|---|---|---|---|"]
    hf = results.get("hf_generate")
    if hf is not None:
        w = hf["workload"]
        lines.append(f"| HF generate, static batches of {w['batch_size']}, {hf['attn_implementation']} "
                     f"| {w['output_tok_per_s']:,.0f} | {w['total_tok_per_s']:,.0f} | "
                     f"{w['cpu_ms_per_output_token']:.3f} "
                     f"| {_decode(hf['decode'])} | - |")
    for c in configs:
        name = c["config"] if c["config"] != "default" else f"default ({c.get('backend')}:{c.get('block_size')})"
        if "skipped" in c or "error" in c:
            lines.append(f"| {name} | {'skipped' if 'skipped' in c else 'failed'}: {c.get('skipped') or c['error']} "
                         "| | | | |")
            continue
        w, t = c["workload"], c["ttft"]
        lines.append(f"| {name} | {w['output_tok_per_s']:,.0f} | {w['total_tok_per_s']:,.0f} "
                     f"| {w['cpu_ms_per_output_token']:.3f} | {_decode(c['decode'])} "
                     f"| {t['cold']['wall_ms']:.1f} / {t['cached']['wall_ms']:.1f} |")
    floor = results["weight_read_floor"]
    lines.append("")
    lines.append(f"Weight-read floor: {floor['floor_ms_per_decode_step']:.3g} ms per decode step "
                 f"({floor['weight_bytes'] / 1e6:,.1f} MB of weights / {floor['bandwidth']['bytes_per_s'] / 1e9:,.1f} "
                 f"GB/s, "
                 f"{floor['bandwidth']['method']}).")
    return "\n".join(lines)

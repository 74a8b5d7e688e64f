"""The run as a picture: output tok/s per configuration, decode ms/step vs running sequences (with the
weight-read floor), TTFT cold vs prefix-cached."""

from __future__ import annotations

from pathlib import Path


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = [c for c in results["configs"] if "ttft" in c]
    hf = results.get("hf_generate")
    fig, (tput, decode, ttft) = plt.subplots(1, 3, figsize=(15, 4.2))
    device = results["environment"]["device"]
    fig.suptitle(f"kvmesh bench engine-speed: preset {results['preset']} on {device}", fontsize=10)

    labels = [c["config"] + ("" if c["config"] != "default" else f"\n({c['backend']}:{c['block_size']})")
              for c in measured]
    values = [c["workload"]["output_tok_per_s"] for c in measured]
    if hf is not None:
        labels.append(f"HF generate\nb={hf['workload']['batch_size']}")
        values.append(hf["workload"]["output_tok_per_s"])
    tput.bar(labels, values, color=["tab:blue"] * len(measured) + ["tab:gray"] * (hf is not None))
    tput.set_title(f"output tok/s, {results['workload']['num_requests']} requests at once", fontsize=9)
    tput.tick_params(axis="x", labelsize=7)

    series = [(c["config"], c["decode"]) for c in measured] + ([("HF generate", hf["decode"])] if hf else [])
    for name, rows in series:
        rows = [r for r in rows if "wall_ms_per_step" in r]
        decode.plot([r["running_seqs"] for r in rows], [r["wall_ms_per_step"] for r in rows], marker="o",
                    label=name, linestyle="--" if name == "HF generate" else "-")
    floor = results["weight_read_floor"]["floor_ms_per_decode_step"]
    decode.axhline(floor, color="tab:red", linestyle=":", label=f"weight-read floor {floor:.3g} ms")
    decode.set_xscale("log", base=2)
    decode.set_xlabel("running sequences")
    decode.set_ylabel("wall ms per decode step")
    decode.set_title("decode step", fontsize=9)
    decode.legend(fontsize=7)

    x = range(len(measured))
    width = 0.4
    ttft.bar([i - width / 2 for i in x], [c["ttft"]["cold"]["wall_ms"] for c in measured], width, label="cold")
    ttft.bar([i + width / 2 for i in x], [c["ttft"]["cached"]["wall_ms"] for c in measured], width,
             label="prefix cached")
    ttft.set_xticks(list(x), [c["config"] for c in measured], fontsize=7)
    prefix = measured[0]["ttft"]["prefix_len"] if measured else 0
    ttft.set_title(f"TTFT ms, {prefix}-token prefix + 16 new tokens", fontsize=9)
    ttft.legend(fontsize=7)

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

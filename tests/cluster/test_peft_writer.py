"""The benchmarks' adapters (support/peft_writer.py) are PEFT adapters: peft loads every tensor where it was written,
and the adapter changes the model's output."""

from __future__ import annotations

import pytest

pytest.importorskip("peft", reason="peft is the reference for the PEFT layout (pip install peft)")


def test_peft_loads_the_written_adapter_with_every_tensor_in_place(stories_path, tmp_path):
    import torch
    from kvmesh.cluster.measure.benchmarks.support.peft_writer import write_lora_adapter
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    out = write_lora_adapter(stories_path, tmp_path / "a", seed=3, r=8)
    written = load_file(out / "adapter_model.safetensors")
    hf = AutoModelForCausalLM.from_pretrained(stories_path, dtype=torch.float32)
    model = PeftModel.from_pretrained(hf, out)
    loaded = {k.replace(".default", ""): v for k, v in model.state_dict().items() if "lora_" in k}
    assert set(loaded) == set(written) and len(written) == 5 * 7 * 2
    for key, tensor in written.items():
        assert torch.equal(loaded[key], tensor), key
    base = AutoModelForCausalLM.from_pretrained(stories_path, dtype=torch.float32)
    ids = torch.tensor([[1, 403, 407, 261, 378]])
    with torch.no_grad():
        assert not torch.allclose(model(ids).logits, base(ids).logits)  # the adapter changes the model

"""LoRA adapters in the engine (vLLM's ``vllm/lora``): PEFT loading, device slots, the gathered low-rank update.

    peft_config.py  adapter_config.json read and checked (what kvmesh serves, what it refuses)
    adapter.py      an adapter's weights loaded from PEFT's safetensors onto kvmesh's layers (host memory)
    ops.py          y += (x @ A[slot].T) @ B[slot].T per token, torch (CPU, reference) or Triton (CUDA)
    triton_lora.py  the Triton shrink / expand kernels (punica's SGMV shape)
    layers.py       the LoRA wrappers of the linear layers (column- and row-parallel, merged slices)
    slots.py        which adapter sits in which device slot (LRU, torch-free)
    manager.py      the runner's LoRA state: host cache (max_cpu_loras), slots (max_loras), the step's mapping
"""

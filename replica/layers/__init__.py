"""Building blocks of the decoder: tensor-parallel linears, embeddings, RoPE, RMSNorm, SwiGLU.

RMSNorm, RoPE and SwiGLU are ``CustomOp``s (``custom_op.py``): plain torch on CPU/meta, one Triton
kernel each (``triton_*.py``) on CUDA.
"""

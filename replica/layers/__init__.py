"""Building blocks of the decoder: tensor-parallel linears, embeddings, RoPE, RMSNorm, SwiGLU."""

"""Pure Keras: the BERT config, encoder, fused encoder and kernels, heads, and what each head kind means
(objectives)."""

"""What the benchmark scripts share: timing and the machine's description, intervals, the in-process ceiling, the
served variants, load generators, server processes and the peers (infinity-emb, Triton)."""

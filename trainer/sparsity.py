"""How sparse an encoder's attention is: the fraction of exactly-zero weights per layer (SSAF's visible effect).

Counted over real (query, key) pairs only: padding keys are zero under every attention function and padding queries
are never read, so counting them would report sparsity that the model did not learn.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from bertzoo.tokenization import Encoding, pad_batch

from .model import Encoder


@torch.no_grad()
def attention_zero_fraction(encoder: Encoder, encodings: Sequence[Encoding], pad_id: int, batch_size: int = 32
                            ) -> list[float]:
    """Per layer: exact zeros / real (query, key) pairs, over all heads and the given sentences."""
    was_training = encoder.training
    encoder.eval()
    device = next(encoder.parameters()).device
    zeros = np.zeros(encoder.config.num_hidden_layers)
    pairs = 0.0
    try:
        for start in range(0, len(encodings), batch_size):
            batch = {k: torch.from_numpy(v).to(device) for k, v in pad_batch(encodings[start:start + batch_size],
                                                                              pad_id).items()}
            out = encoder(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], output_attentions=True)
            real = batch["attention_mask"].bool()
            pair_mask = (real[:, None, :, None] & real[:, None, None, :])  # [B, 1, Tq, Tk]
            heads = out.attentions[0].shape[1]
            pairs += float(pair_mask.sum()) * heads
            for i, probs in enumerate(out.attentions):
                zeros[i] += float(((probs == 0) & pair_mask).sum())
    finally:
        encoder.train(was_training)
    return (zeros / max(pairs, 1.0)).tolist()

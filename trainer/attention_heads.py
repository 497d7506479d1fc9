"""The zoo's task-specific attention heads, on top of the shared encoder's token states.

Paper 001 (task-specific attention):
- ``SelfAttentionSentimentHead`` ("self_attention"): a stack of self-attention layers, the first token's output as the
  sentence's representation, dropout + linear to the labels.
- ``CrossAttentionPairHead`` ("cross_attention"): a stack of cross-attention layers between the two sentences (each
  sentence's tokens attend to the other's), the first token's output per sentence, a linear transform, and the two
  transformed encodes combined by a dot product.
- ``uniform_init_``: the paper's U(0.9, 1) initialisation of the attention layers' weights (``head_uniform_init``).

Paper 004 (cross-attention + attention pooling):
- ``CrossPoolPairHead`` ("cross_pool"): bidirectional cross-attention, attention pooling to p1, p2, then
  [p1; p2; p1 - p2] -> LayerNorm -> ReLU -> dropout -> linear for paraphrase, cosine(p1, p2) mapped from [-1, 1] to
  [0, 5] for similarity.

Every head keeps the interface of trainer/heads.py (sentence heads ``forward(states, mask)``, pair heads
``forward(states_a, mask_a, states_b, mask_b)`` with each sentence padded to its own length) and ignores padding:
padded positions are never attended to as keys nor pooled, and only the first token (always real) is read out, so
adding padding to a sentence leaves its outputs unchanged. Everything is plain tensor algebra (no fused kernels), so
the torch.onnx dynamo exporter turns each head into one small graph with dynamic batch and sequence axes.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .sparsegen import masked_softmax

PAIR_KINDS = ("paraphrase", "similarity")


class AttentionLayer(nn.Module):
    """Multi-head scaled dot-product attention of ``x``'s tokens over ``context``'s (the same tensor for self-attention,
    the other sentence for cross-attention), the context's padding keys masked, then output projection, dropout,
    residual and LayerNorm. Four H x H projections, as paper 001 counts a self-attention block."""

    def __init__(self, hidden: int, num_heads: int, dropout: float, eps: float) -> None:
        super().__init__()
        if hidden % num_heads:
            raise ValueError(f"hidden size {hidden} is not a multiple of {num_heads} attention heads")
        self.num_heads, self.head_size = num_heads, hidden // num_heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.output = nn.Linear(hidden, hidden)
        self.dropout = nn.Dropout(dropout)
        self.LayerNorm = nn.LayerNorm(hidden, eps=eps)

    def _heads(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        return x.reshape(b, t, self.num_heads, self.head_size).transpose(1, 2)

    def forward(self, x: Tensor, context: Tensor, context_mask: Tensor) -> Tensor:
        q, k, v = self._heads(self.query(x)), self._heads(self.key(context)), self._heads(self.value(context))
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_size)
        probs = masked_softmax(scores, context_mask.bool()[:, None, None, :])
        b, _, t, _ = q.shape
        attended = (probs @ v).transpose(1, 2).reshape(b, t, -1)
        return self.LayerNorm(x + self.dropout(self.output(attended)))


class CrossAttentionLayer(nn.Module):
    """Paper 001's cross-attention block: an attention layer over the other sentence plus "one more H x H linear layer
    for intermediate transformation" (the paper gives only that count). Our reading: a position-wise GELU(linear)
    with its own residual and LayerNorm, i.e. BERT's intermediate sub-layer without the widening."""

    def __init__(self, hidden: int, num_heads: int, dropout: float, eps: float) -> None:
        super().__init__()
        self.attention = AttentionLayer(hidden, num_heads, dropout, eps)
        self.intermediate = nn.Linear(hidden, hidden)
        self.dropout = nn.Dropout(dropout)
        self.LayerNorm = nn.LayerNorm(hidden, eps=eps)

    def forward(self, x: Tensor, context: Tensor, context_mask: Tensor) -> Tensor:
        y = self.attention(x, context, context_mask)
        return self.LayerNorm(y + self.dropout(F.gelu(self.intermediate(y))))


def uniform_init_(layers: nn.Module, low: float = 0.9, high: float = 1.0) -> None:
    """Paper 001 (section 3.2.2): the task-specific attention layers' weights drawn from U(0.9, 1), so their entries are
    close to each other and the attention starts near uniform (a learnable version of mean pooling, which the paper's
    baseline showed to work), yet not equal, so the optimizer can tell them apart.

    Applied to every weight matrix of the attention layers (query, key, value, output and, in cross-attention blocks,
    the intermediate one), as the paper's Table 4 says "attention layers". The biases of those layers are zeroed (the
    paper speaks of weight entries only; zero keeps the scores' spread small, which is the point of the init). The
    classifier / projection after the layers and the LayerNorms keep their usual initialisation: they are not
    attention weights (the baseline, which has no attention layer, has the same classifier)."""
    with torch.no_grad():
        for module in layers.modules():
            if isinstance(module, nn.Linear):
                module.weight.uniform_(low, high)
                if module.bias is not None:
                    module.bias.zero_()


class SelfAttentionSentimentHead(nn.Module):
    """Paper 001 for sentiment: ``layers`` self-attention layers (paper: 2), the first token's output, dropout, linear."""

    def __init__(self, hidden: int, num_labels: int, layers: int, num_heads: int, dropout: float, eps: float,
                 uniform_init: bool = False) -> None:
        super().__init__()
        if layers < 0:
            raise ValueError(f"sentiment_attention_layers must be >= 0, got {layers}")
        self.layers = nn.ModuleList(AttentionLayer(hidden, num_heads, dropout, eps) for _ in range(layers))
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(hidden, num_labels)
        if uniform_init:
            uniform_init_(self.layers)

    def forward(self, states: Tensor, mask: Tensor) -> Tensor:
        x = states
        for layer in self.layers:
            x = layer(x, x, mask)
        # Section 3.2.1: the last attention layer's first-token ([CLS]) output is the sentence's encode.
        return self.classifier(self.dropout(x[:, 0]))


class CrossAttentionPairHead(nn.Module):
    """Paper 001 for paraphrase (1 layer) and STS (3 layers).

    Each layer runs in both directions with the same weights: sentence a's tokens attend to b's and b's to a's. The
    paper reads out an encode for *each* sentence (section 3.2.1) and combines the two, so both directions are needed;
    its parameter count (5 H x H matrices per cross-attention layer, Table 3) leaves room for one set of weights
    only. The directions are computed side by side from the previous layer's outputs, so the result does not depend on
    which sentence goes first except through the (symmetric) combination below.

    Section 3.3: the first-token encodes are "further transformed by a linear layer" (H -> H for paraphrase, H -> 4H
    for STS, as Table 3's counts give) shared by the two sentences, and the output is "a dot multiplication between
    the two sentences' transformed encodes". Our choices where the paper stops there:
    - paraphrase: the dot product divided by sqrt(width) is the logit, with no bias, as the paper describes. The
      scaling keeps the logits' spread O(1) (a learned linear layer can absorb it), but not their mean: any two
      questions' first-token encodes start closely aligned, so the first logits are large and positive (on Quora the
      first logged loss is about 2.7, against ln 2 for an unbiased start), which training has to undo;
    - similarity: the same dot product of the L2-normalised encodes, i.e. 5 * cosine, so the score is on the 0-5 scale
      like the baseline cosine head (negative values are clipped in post-processing, not here, and keep their
      gradient). With paper 001's negative-Pearson loss (``similarity_loss = "neg_pearson"``) only the ranking
      matters; with MSE the bounded scale is what the targets expect.
    """

    def __init__(self, hidden: int, kind: str, layers: int, num_heads: int, dropout: float, eps: float,
                 uniform_init: bool = False) -> None:
        super().__init__()
        if kind not in PAIR_KINDS:
            raise ValueError(f"kind must be one of {PAIR_KINDS}, got {kind!r}")
        if layers < 0:
            raise ValueError(f"{kind}_cross_layers must be >= 0, got {layers}")
        self.kind = kind
        self.layers = nn.ModuleList(CrossAttentionLayer(hidden, num_heads, dropout, eps) for _ in range(layers))
        self.dropout = nn.Dropout(dropout)
        width = hidden if kind == "paraphrase" else 4 * hidden
        self.projection = nn.Linear(hidden, width)
        self.scale = 1.0 / math.sqrt(width)
        if uniform_init:
            uniform_init_(self.layers)

    def encodes(self, states_a: Tensor, mask_a: Tensor, states_b: Tensor, mask_b: Tensor) -> tuple[Tensor, Tensor]:
        """The two sentences' first-token encodes after the cross-attention layers, [B, H] each."""
        a, b = states_a, states_b
        for layer in self.layers:
            a, b = layer(a, b, mask_b), layer(b, a, mask_a)
        return a[:, 0], b[:, 0]

    def forward(self, states_a: Tensor, mask_a: Tensor, states_b: Tensor, mask_b: Tensor) -> Tensor:
        a, b = self.encodes(states_a, mask_a, states_b, mask_b)
        u, v = self.projection(self.dropout(a)), self.projection(self.dropout(b))
        if self.kind == "paraphrase":
            return (u * v).sum(-1) * self.scale
        return 5.0 * F.cosine_similarity(u, v, dim=-1)


class CrossPoolPairHead(nn.Module):
    """Paper 004's pair head: bidirectional cross-attention between the two token sequences, attention pooling of each
    sentence's cross-attended tokens to one vector (p1, p2), then the task's combination.

    Where paper 004 is vague we chose:
    - cross-attention: its equation (2), softmax(QK^T / sqrt(d_k)) V, with Q from one sentence and K, V from the other;
      one head (the equation has none), learned Q/K/V and output projections, and the add-norm (residual +
      LayerNorm) the paper's own minBERT layers use, so each token keeps its own content next to what it gathered from
      the other sentence. One set of weights serves both directions (paraphrase and similarity are symmetric).
    - the paper applies dropout to the encoder outputs before the cross-attention ("CrossAttention(Dropout(E1),
      Dropout(E2))"); we do the same with ``head_dropout``.
    - attention pooling (equation 3): alpha = masked softmax over tokens of a learned scoring vector w . h_j (no bias:
      a bias cancels in the softmax), pooled = sum_j alpha_j h_j; the scoring vector is shared by both sentences.
    - similarity: cosine(p1, p2) after dropout, "normalized from [-1, 1] to [0, 5]" as the paper says, i.e.
      2.5 * (cosine + 1): the whole cosine range maps linearly onto the STS scale, nothing needs clipping and every
      value keeps its gradient.
    """

    def __init__(self, hidden: int, kind: str, dropout: float, eps: float) -> None:
        super().__init__()
        if kind not in PAIR_KINDS:
            raise ValueError(f"kind must be one of {PAIR_KINDS}, got {kind!r}")
        self.kind = kind
        self.dropout = nn.Dropout(dropout)
        self.cross = AttentionLayer(hidden, 1, dropout, eps)
        self.pool_score = nn.Linear(hidden, 1, bias=False)
        if kind == "paraphrase":
            self.norm = nn.LayerNorm(3 * hidden, eps=eps)
            self.classifier = nn.Linear(3 * hidden, 1)

    def attention_pool(self, h: Tensor, mask: Tensor) -> Tensor:
        alpha = masked_softmax(self.pool_score(h).squeeze(-1), mask.bool())
        return (alpha.unsqueeze(-1) * h).sum(1)

    def pooled(self, states_a: Tensor, mask_a: Tensor, states_b: Tensor, mask_b: Tensor) -> tuple[Tensor, Tensor]:
        """p1, p2 [B, H]: each sentence's tokens after attending to the other sentence, attention-pooled."""
        a, b = self.dropout(states_a), self.dropout(states_b)
        h1, h2 = self.cross(a, b, mask_b), self.cross(b, a, mask_a)
        return self.attention_pool(h1, mask_a), self.attention_pool(h2, mask_b)

    def forward(self, states_a: Tensor, mask_a: Tensor, states_b: Tensor, mask_b: Tensor) -> Tensor:
        p1, p2 = self.pooled(states_a, mask_a, states_b, mask_b)
        if self.kind == "paraphrase":
            features = F.relu(self.norm(torch.cat([p1, p2, p1 - p2], dim=-1)))
            return self.classifier(self.dropout(features)).squeeze(-1)
        return 2.5 * (F.cosine_similarity(self.dropout(p1), self.dropout(p2), dim=-1) + 1.0)

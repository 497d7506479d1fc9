"""The bertzoo encoder: a compact BERT whose attention probability function is part of its config.

One definition used by training, export and the PyTorch reference backend. Module names mirror HuggingFace's
``BertModel`` (``embeddings.word_embeddings``, ``encoder.layer.N.attention.self.query`` ...), so a HuggingFace BERT
``model.safetensors`` loads with no renaming table, and with softmax the hidden states match ``transformers.BertModel``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import Tensor, nn

from bertzoo.backbone import BackboneError

from .sparsegen import ATTENTION_FUNCTIONS, SPARSEGEN_IMPLS, attention_probs


@dataclass
class EncoderConfig:
    vocab_size: int = 30522
    hidden_size: int = 384
    num_hidden_layers: int = 6
    num_attention_heads: int = 12
    intermediate_size: int = 1536
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    pad_token_id: int = 0
    # The attention probability function: "softmax", or "sparsegen_lin" with its coefficient lambda < 1 (SSAF).
    attention: str = "softmax"
    sparsegen_lambda: float = 0.0
    sparsegen_impl: str = "bisect"

    def __post_init__(self) -> None:
        if self.attention not in ATTENTION_FUNCTIONS:
            raise ValueError(f"attention must be one of {ATTENTION_FUNCTIONS}, got {self.attention!r}")
        if self.sparsegen_impl not in SPARSEGEN_IMPLS:
            raise ValueError(f"sparsegen_impl must be one of {SPARSEGEN_IMPLS}, got {self.sparsegen_impl!r}")
        if not self.sparsegen_lambda < 1:
            raise ValueError(f"sparsegen_lambda must be < 1, got {self.sparsegen_lambda}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not a multiple of num_attention_heads {self.num_attention_heads}"
            )

    @classmethod
    def from_dict(cls, config: dict, **overrides) -> EncoderConfig:
        """From a HuggingFace BERT config.json (unknown keys ignored) or our own saved dict, then ``overrides``."""
        known = {f.name for f in fields(cls)}
        unknown = set(overrides) - known
        if unknown:
            raise ValueError(f"unknown encoder config keys: {sorted(unknown)}; known: {sorted(known)}")
        if config.get("hidden_act", "gelu") != "gelu":
            raise ValueError(f"only hidden_act 'gelu' is supported, got {config['hidden_act']!r}")
        if config.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError("only absolute position embeddings are supported")
        values = {k: v for k, v in config.items() if k in known}
        values.update(overrides)
        return cls(**values)

    def to_dict(self) -> dict:
        return asdict(self)


class Packing(NamedTuple):
    """Where a packed batch's real tokens sit in its padded [batch, seq] grid (``bertzoo.packing`` explains why).

    With a packing, every per-token layer runs on the [n, hidden] real tokens alone; attention alone works on the
    padded grid. The exported encoder graph takes these as inputs; ``from_mask`` builds them in torch.
    """

    position_ids: Tensor  # [n] each token's position in its sequence
    token_index: Tensor  # [n] each token's place in the flattened grid
    pad_index: Tensor  # [batch * seq] each grid cell's row in the n tokens plus one zero row (index n) for padding

    @classmethod
    def from_mask(cls, attention_mask: Tensor) -> Packing:
        rows, seq = attention_mask.shape
        token_index = attention_mask.reshape(-1).nonzero().squeeze(1)
        pad_index = torch.full((rows * seq,), len(token_index), dtype=torch.long, device=attention_mask.device)
        pad_index[token_index] = torch.arange(len(token_index), device=attention_mask.device)
        positions = torch.arange(seq, device=attention_mask.device).repeat(rows)
        return cls(positions[token_index], token_index, pad_index)

    def to_grid(self, x: Tensor, rows: int, seq: int) -> Tensor:
        """[n, d] tokens -> [rows, seq, d], zeros at padding."""
        if x.requires_grad:
            # Training: a scatter, whose backward is a gather. The gather below has for backward a scatter-add of
            # every padding cell into one row, much slower on a CPU (the two give the same values).
            grid = x.new_zeros(rows * seq, x.shape[-1]).index_copy(0, self.token_index, x)
        else:
            # Inference and export: one gather (ONNX GatherND) from the tokens and a zero row.
            grid = torch.cat([x, x.new_zeros(1, x.shape[-1])])[self.pad_index]
        return grid.view(rows, seq, x.shape[-1])

    def to_tokens(self, x: Tensor) -> Tensor:
        """[rows, seq, d] -> [n, d], the real tokens only."""
        grid = x.reshape(-1, x.shape[-1])
        # index_select's backward is a plain index_add; indexing's an accumulating index_put, slower on a CPU. The
        # exported graph keeps indexing (ONNX GatherND), the form its speed was measured with.
        return grid.index_select(0, self.token_index) if x.requires_grad else grid[self.token_index]


class EncoderOutput(NamedTuple):
    last_hidden_state: Tensor  # [batch, seq, hidden]
    attentions: tuple[Tensor, ...] | None  # per layer [batch, heads, seq, seq], when asked for


class Embeddings(nn.Module):
    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: Tensor, token_type_ids: Tensor, position_ids: Tensor | None = None) -> Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device) if position_ids is None else position_ids
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions) + self.token_type_embeddings(
            token_type_ids
        )
        return self.dropout(self.LayerNorm(x))


class SelfAttention(nn.Module):
    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_size = config.hidden_size // config.num_attention_heads
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout_p = config.attention_probs_dropout_prob
        self.function = config.attention
        self.lam = config.sparsegen_lambda
        self.impl = config.sparsegen_impl

    def forward(self, x: Tensor, key_mask: Tensor, output_attentions: bool, packing: Packing | None = None
                ) -> tuple[Tensor, Tensor | None]:
        """``x``: [batch, seq, hidden], or [n, hidden] tokens with their ``packing``; ``key_mask``: bool
        [batch, 1, 1, seq], True where a key may be attended. The context comes back in ``x``'s layout."""
        b, t = key_mask.shape[0], key_mask.shape[-1]

        def heads(y: Tensor) -> Tensor:
            if packing is not None:
                y = packing.to_grid(y, b, t)
            return y.view(b, t, self.num_heads, self.head_size).transpose(1, 2)

        q, k, v = heads(self.query(x)), heads(self.key(x)), heads(self.value(x))
        dropout_p = self.dropout_p if self.training else 0.0
        if self.function == "softmax" and not output_attentions and torch.onnx.is_in_onnx_export():
            # The exported graph: softmax over scores plus a bias. torch.onnx writes SDPA with a guard for rows whose
            # every key is masked (IsNaN and Where over every probability), which cost ONNX Runtime 3-14% of an
            # encoder batch (benchmarks/RESULTS.md, "Export parity and speed"); every row here attends to at least
            # its own [CLS].
            bias = torch.zeros((), dtype=q.dtype, device=q.device).masked_fill(~key_mask, torch.finfo(q.dtype).min)
            scores = (q / math.sqrt(self.head_size)) @ k.transpose(-1, -2) + bias
            context = torch.softmax(scores, dim=-1) @ v
            probs = None
        elif self.function == "softmax" and not output_attentions:
            # PyTorch's SDPA: a fused kernel where one applies (on the CPU not with dropout, so training runs its
            # math path), the same math in any case.
            context = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask, dropout_p=dropout_p)
            probs = None
        else:
            scores = (q / math.sqrt(self.head_size)) @ k.transpose(-1, -2)  # scaling q: t/d times fewer elements
            probs = attention_probs(scores, key_mask, self.function, self.lam, self.impl)
            context = F.dropout(probs, dropout_p, self.training) @ v
        context = context.transpose(1, 2).reshape(b, t, -1)
        return (context if packing is None else packing.to_tokens(context)), probs


class SelfOutput(nn.Module):
    """Projection + residual + LayerNorm, used after attention (``attention.output``) and after the FFN (``output``)."""

    def __init__(self, in_size: int, config: EncoderConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(in_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, x: Tensor, residual: Tensor) -> Tensor:
        return self.LayerNorm(self.dropout(self.dense(x)) + residual)


class Attention(nn.Module):
    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.self = SelfAttention(config)
        self.output = SelfOutput(config.hidden_size, config)


class Intermediate(nn.Module):
    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)

    def forward(self, x: Tensor) -> Tensor:
        return F.gelu(self.dense(x))  # exact (erf) GELU, as BERT's "gelu"


class Layer(nn.Module):
    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.attention = Attention(config)
        self.intermediate = Intermediate(config)
        self.output = SelfOutput(config.intermediate_size, config)

    def forward(self, x: Tensor, key_mask: Tensor, output_attentions: bool, packing: Packing | None = None
                ) -> tuple[Tensor, Tensor | None]:
        context, probs = self.attention.self(x, key_mask, output_attentions, packing)
        x = self.attention.output(context, x)
        return self.output(self.intermediate(x), x), probs


class LayerStack(nn.Module):
    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(Layer(config) for _ in range(config.num_hidden_layers))


class Encoder(nn.Module):
    """BERT encoder: token ids -> contextual token states (no pooler: heads pool for themselves)."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.encoder = LayerStack(config)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        # BERT's initialisation, used when a backbone is built from its config alone (pre-training from scratch).
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
        if isinstance(module, nn.Embedding) and module.padding_idx is not None:
            with torch.no_grad():
                module.weight[module.padding_idx].zero_()
        if isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        token_type_ids: Tensor | None = None,
        output_attentions: bool = False,
        packing: Packing | None = None,
        pack: bool = False,
    ) -> EncoderOutput:
        """``input_ids``/``token_type_ids``: [batch, seq], or with ``packing`` the [n] real tokens only; the states
        come back as [batch, seq, hidden] either way (zeros at padding when packed). ``pack``: take a padded batch
        and pack it here (the same states on the real tokens, less work on padding)."""
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        if pack and packing is None:
            packing = Packing.from_mask(attention_mask)
            real = attention_mask.bool()
            input_ids, token_type_ids = input_ids[real], token_type_ids[real]
        rows, seq = attention_mask.shape
        if seq > self.config.max_position_embeddings:
            raise ValueError(
                f"sequence length {seq} exceeds max_position_embeddings {self.config.max_position_embeddings}"
            )
        key_mask = attention_mask.bool()[:, None, None, :]
        x = self.embeddings(input_ids, token_type_ids, None if packing is None else packing.position_ids)
        attentions = []
        for layer in self.encoder.layer:
            x, probs = layer(x, key_mask, output_attentions, packing)
            attentions.append(probs)
        if packing is not None:
            x = packing.to_grid(x, rows, seq)
        return EncoderOutput(x, tuple(attentions) if output_attentions else None)

    def load_pretrained(self, weights_path: str | Path) -> None:
        """Load HuggingFace BERT weights from safetensors (never pickle); the pooler and buffers are not used."""
        try:
            state = load_file(str(weights_path))
        except SafetensorError as e:
            raise BackboneError(f"{weights_path}: unreadable, truncated or corrupt ({e}); copy the backbone again") from e
        # Checkpoints saved from BertFor* models prefix every key with "bert."
        state = {k.removeprefix("bert."): v for k, v in state.items()}
        own = self.state_dict()
        missing = [k for k in own if k not in state]
        if missing:
            raise BackboneError(f"{weights_path}: missing encoder weights {missing[:5]}{' ...' if len(missing) > 5 else ''}")
        for name, tensor in own.items():
            if state[name].shape != tensor.shape:
                raise BackboneError(
                    f"{weights_path}: {name} has shape {tuple(state[name].shape)}, the config expects {tuple(tensor.shape)}"
                )
        self.load_state_dict({k: state[k] for k in own}, strict=True)

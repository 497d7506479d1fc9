"""The masked-language-model objective, apart from the loop that trains with it: BERT's masking of a batch, BERT's
MLM head on the encoder, and the HuggingFace-format backbone directory a pre-training run leaves.

BERT's recipe: in every sequence 15% of the real tokens (not [PAD], [CLS], [SEP], [MASK] or [UNK]) are selected
(BERT's ``max(1, round(0.15 * n))`` per sequence), of which 80% become [MASK], 10% a random token and 10% stay
unchanged; the loss is the cross-entropy on the selected positions only. The MLM head is BERT's (dense + GELU +
LayerNorm, decoder tied to the word embeddings plus a bias) with HuggingFace's names (``cls.predictions.*``), so a
BertForMaskedLM checkpoint's head loads as is; the backbone directory written here (HuggingFace's layout) is what
``bertzoo train --backbone`` fine-tunes from.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from bertzoo.atomic import atomic_directory
from bertzoo.tokenization import Tokenizer

from .model import Encoder, EncoderConfig

IGNORE = -100  # the label of positions without an MLM target (F.cross_entropy's ignore_index)
HEAD_PREFIX = "cls.predictions."


# ---------------------------------------------------------------- masking


def special_ids(tokenizer: Tokenizer) -> Tensor:
    """The ids masking leaves alone and never draws as a random replacement."""
    return torch.tensor(sorted({tokenizer.pad_id, tokenizer.cls_id, tokenizer.sep_id, tokenizer.mask_id,
                                tokenizer.unk_id}))


def mask_tokens(input_ids: Tensor, attention_mask: Tensor, specials: Tensor, mask_id: int, vocab_size: int,
                generator: torch.Generator, mask_prob: float = 0.15) -> tuple[Tensor, Tensor]:
    """(model input, labels): BERT's masking. ``labels`` holds the original id at selected positions, -100 elsewhere."""
    candidates = attention_mask.bool() & ~torch.isin(input_ids, specials)
    n = candidates.sum(1)
    k = torch.where(n > 0, (n.double() * mask_prob).round().long().clamp(min=1), torch.zeros_like(n))
    # A random rank among each row's candidates; the k lowest ranks are selected.
    scores = torch.rand(input_ids.shape, generator=generator).masked_fill(~candidates, 2.0)
    rank = scores.argsort(1).argsort(1)
    selected = candidates & (rank < k[:, None])
    labels = torch.where(selected, input_ids, torch.full_like(input_ids, IGNORE))
    action = torch.rand(input_ids.shape, generator=generator)
    allowed = torch.ones(vocab_size, dtype=torch.bool)
    allowed[specials] = False
    pool = allowed.nonzero().squeeze(1)  # random replacements are ordinary tokens
    random_ids = pool[torch.randint(len(pool), input_ids.shape, generator=generator)]
    inputs = torch.where(selected & (action < 0.8), torch.full_like(input_ids, mask_id), input_ids)
    inputs = torch.where(selected & (action >= 0.8) & (action < 0.9), random_ids, inputs)
    return inputs, labels


# ---------------------------------------------------------------- the MLM head


class _Predictions(nn.Module):
    """BERT's ``cls.predictions``: a transform (dense + GELU + LayerNorm) and the bias of the tied decoder."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.transform = nn.ModuleDict({"dense": nn.Linear(config.hidden_size, config.hidden_size),
                                        "LayerNorm": nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)})
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, states: Tensor, word_embeddings: Tensor) -> Tensor:
        states = self.transform["LayerNorm"](F.gelu(self.transform["dense"](states)))
        return states @ word_embeddings.T + self.bias


class MaskedLM(nn.Module):
    """Encoder + BERT's MLM head; the decoder is the word-embedding matrix itself (tied), so only the transform and
    the bias are the head's own weights. Logits are computed only at the selected positions (15% of the tokens),
    which saves most of the [tokens x vocabulary] product."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.bert = Encoder(config)
        self.cls = nn.ModuleDict({"predictions": _Predictions(config)})
        Encoder._init_weights(self.cls.predictions.transform.dense)

    def head_state(self) -> dict[str, Tensor]:
        return {HEAD_PREFIX + k: v for k, v in self.cls.predictions.state_dict().items()}

    def load_head(self, weights_path: Path) -> bool:
        """Load ``cls.predictions.*`` from a safetensors file if it has them all; False when it has none."""
        state = load_file(str(weights_path))
        state = {k.removeprefix("bert."): v for k, v in state.items()}
        if "cls.predictions.decoder.bias" in state and HEAD_PREFIX + "bias" not in state:
            state[HEAD_PREFIX + "bias"] = state["cls.predictions.decoder.bias"]
        wanted = self.head_state()
        present = [k for k in wanted if k in state]
        if not present:
            return False
        if len(present) < len(wanted) or any(state[k].shape != wanted[k].shape for k in wanted):
            raise ValueError(f"{weights_path}: incomplete or mis-shaped MLM head weights {sorted(present)}")
        self.cls.predictions.load_state_dict({k.removeprefix(HEAD_PREFIX): state[k] for k in wanted})
        return True

    def forward(self, input_ids: Tensor, attention_mask: Tensor, labels: Tensor, output_attentions: bool = False
                ) -> tuple[Tensor, tuple[Tensor, ...] | None, int]:
        """(mean cross-entropy over the selected positions, attention maps, number of selected positions)."""
        encoded = self.bert(input_ids, attention_mask, output_attentions=output_attentions)
        selected = labels != IGNORE
        logits = self.cls["predictions"](encoded.last_hidden_state[selected], self.bert.embeddings.word_embeddings.weight)
        count = int(selected.sum())
        loss = F.cross_entropy(logits.float(), labels[selected], reduction="sum") / max(1, count)
        return loss, encoded.attentions, count


# ---------------------------------------------------------------- the backbone directory


def hf_config(config: EncoderConfig) -> dict:
    """A HuggingFace BertConfig-compatible config.json that EncoderConfig.from_dict reads back exactly (our extra keys,
    such as the attention function, ride along: transformers keeps unknown keys as attributes)."""
    return {"architectures": ["BertForMaskedLM"], "model_type": "bert", "hidden_act": "gelu",
            "position_embedding_type": "absolute", "initializer_range": 0.02, **config.to_dict()}


def save_backbone(model: MaskedLM, tokenizer: Tokenizer, directory: Path) -> Path:
    """Write a backbone directory atomically: built under a temporary name, then renamed into place."""
    # Shareable: a backbone is for others to train from (mkdtemp alone would make it owner-only).
    with atomic_directory(directory, shareable=True) as tmp:
        (tmp / "config.json").write_text(json.dumps(hf_config(model.bert.config), indent=2), encoding="utf-8")
        # Encoder keys as BertModel names them (no prefix, like all-MiniLM-L6-v2) plus the MLM head's.
        tensors = {**model.bert.state_dict(), **model.head_state()}
        save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(tmp / "model.safetensors"))
        (tmp / "tokenizer.json").write_text(tokenizer.to_str(), encoding="utf-8")
    return directory

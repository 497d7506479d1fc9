"""The checkpoint as a Hugging Face model directory (``bertzoo export --hf``): ``transformers.AutoModel`` loads the
encoder as a ``BertModel``, ``sentence_transformers.SentenceTransformer`` loads it with the model's pooling and the
L2 normalisation of bertzoo's ``Embed``, and the task heads travel beside it as safetensors with a JSON that says
how to apply each one.

Layout::

    hf/
      config.json, model.safetensors          BertModel (model_type "bert"); the encoder's own weight names
      tokenizer.json, tokenizer_config.json, special_tokens_map.json, vocab.txt
      modules.json, sentence_bert_config.json, 1_Pooling/config.json, 2_Normalize/   sentence-transformers
      heads.safetensors, heads.json           the task heads ("heads.<task>.*" tensors) and how to apply them

The encoder mirrors HF's module names (trainer/model.py), so its state dict is a BertModel's without the pooler
(``pooler.dense``, the tanh layer over [CLS] of BERT's pretraining), which bertzoo never uses. ``AutoModel`` builds a
BertModel with a pooler whatever the config says (only its constructor's ``add_pooling_layer`` turns it off), so the
directory carries one, and transformers loads it with no missing or unexpected weight and no "newly initialized"
warning: the backbone's pooler when the encoder started from the backbone's weights (as all-MiniLM-L6-v2 has one),
else a freshly initialised one (a random-init encoder, or a backbone without a pooler). ``heads.json`` says which.
Either way ``pooler_output`` is not something bertzoo trained: use ``last_hidden_state`` and the pooling of
``1_Pooling``. An SSAF encoder (sparsegen-lin attention) has no transformers counterpart and is refused.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from bertzoo.backbone import resolve_backbone
from bertzoo.errors import UserError
from bertzoo.tokenization import Tokenizer
from bertzoo.trainer.heads import MultitaskModel

log = logging.getLogger("bertzoo.export")

POOLER = ("pooler.dense.weight", "pooler.dense.bias")
SPECIAL_TOKENS = {"cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]", "mask_token": "[MASK]",
                  "unk_token": "[UNK]"}


class HFExportError(UserError):
    """The model cannot be written as a Hugging Face model; the message says why."""


def _head_recipes(model: MultitaskModel) -> dict[str, dict]:
    """How to apply each head to the encoder's last hidden state (u, v: the pooled sentences of a pair)."""
    config = model.config
    pooled = f"{config.pooling} pooling over real tokens" if config.pooling == "mean" else "the [CLS] state"
    zoo = ("a bertzoo zoo head ({kind}): rebuild it with bertzoo.trainer.heads.build_head(task, "
           "ModelConfig.from_dict(model_config)) and load its tensors")
    recipes = {
        "sentiment": ({"formula": "softmax(classifier(pool(states)))", "pool": pooled, "labels": "labels.sentiment"}
                      if config.sentiment_head == "linear" else {"formula": zoo.format(kind=config.sentiment_head)}),
        "paraphrase": ({"formula": "sigmoid(classifier([u; v; |u - v|])) = P(paraphrase)", "pool": pooled}
                       if config.paraphrase_head == "concat" else {"formula": zoo.format(kind=config.paraphrase_head)}),
        "similarity": ({"formula": "clip(5 * cos(u, v), 0, 5)", "pool": pooled} if config.similarity_head == "cosine"
                       else {"formula": "clip(5 * sigmoid(regressor([u; v; |u - v|])), 0, 5)", "pool": pooled}
                       if config.similarity_head == "concat" else {"formula": zoo.format(kind=config.similarity_head)}),
        "qa": {"formula": "start, end = qa_outputs(states).unbind(-1); [CLS] (index 0) stands for no answer, chosen "
                          "when null score - best span score > qa_null_threshold",
               "qa_null_threshold": config.qa_null_threshold},
    }
    return {task: recipes[task] for task in model.heads}


def check_exportable(model: MultitaskModel) -> None:
    """Refuse a model transformers cannot compute, before any export work starts."""
    attention = model.config.encoder.attention
    if attention != "softmax":
        raise HFExportError(f"--hf: this encoder's attention is {attention}, which transformers' BertModel cannot "
                            "compute (it would silently use softmax); export it without --hf")


def backbone_pooler(backbone: str | None, hidden_size: int) -> dict[str, torch.Tensor] | None:
    """The pooler weights of a backbone (``TrainConfig.backbone``: None or "default" is all-MiniLM-L6-v2), or None
    where it has none of this width or cannot be read any more (a backbone directory moved since training)."""
    try:
        weights = resolve_backbone(backbone).weights_path
        with safe_open(str(weights), "pt") as f:
            present = set(f.keys())
            pooler = {k: f.get_tensor(k) for k in POOLER if k in present}
    except (UserError, OSError, SafetensorError) as e:
        log.warning("--hf: the backbone's pooler could not be read (%s); the directory gets a fresh one", e)
        return None
    if set(pooler) != set(POOLER) or pooler[POOLER[0]].shape != (hidden_size, hidden_size):
        return None
    return {k: v.float().contiguous() for k, v in pooler.items()}


def _fresh_pooler(hidden_size: int, initializer_range: float = 0.02) -> dict[str, torch.Tensor]:
    """BERT's initialisation (normal weights, zero bias), seeded so that one checkpoint always exports the same
    files."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(hidden_size, hidden_size, generator=generator) * initializer_range
    return {POOLER[0]: weight, POOLER[1]: torch.zeros(hidden_size)}


def write_hf(model: MultitaskModel, tokenizer: Tokenizer, tokenizer_file: Path, directory: Path,
             max_seq_length: int, labels: dict, pooler: dict[str, torch.Tensor] | None = None) -> list[str]:
    """Write the Hugging Face directory; returns the files written (relative to ``directory``). ``pooler``: the
    backbone's pooler weights (:func:`backbone_pooler`), None for a fresh one."""
    check_exportable(model)
    enc = model.config.encoder
    directory.mkdir(parents=True)

    def write_json(name: str, data: dict) -> None:
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_text(json.dumps(data, indent=2) + "\n")

    write_json("config.json", {
        "architectures": ["BertModel"], "model_type": "bert", "vocab_size": enc.vocab_size,
        "hidden_size": enc.hidden_size, "num_hidden_layers": enc.num_hidden_layers,
        "num_attention_heads": enc.num_attention_heads, "intermediate_size": enc.intermediate_size,
        "hidden_act": "gelu", "hidden_dropout_prob": enc.hidden_dropout_prob,
        "attention_probs_dropout_prob": enc.attention_probs_dropout_prob,
        "max_position_embeddings": enc.max_position_embeddings, "type_vocab_size": enc.type_vocab_size,
        "layer_norm_eps": enc.layer_norm_eps, "pad_token_id": enc.pad_token_id, "initializer_range": 0.02,
        "position_embedding_type": "absolute", "torch_dtype": "float32"})
    pooler_source = "the backbone's (not trained by bertzoo)" if pooler else "freshly initialised (not trained)"
    pooler = pooler or _fresh_pooler(enc.hidden_size)
    save_file({**{k: v.detach().float().contiguous() for k, v in model.encoder.state_dict().items()}, **pooler},
              str(directory / "model.safetensors"), metadata={"format": "pt"})

    (directory / "tokenizer.json").write_bytes(tokenizer_file.read_bytes())
    vocab = sorted(tokenizer.vocab().items(), key=lambda item: item[1])
    (directory / "vocab.txt").write_text("".join(f"{token}\n" for token, _ in vocab), encoding="utf-8")
    write_json("special_tokens_map.json", SPECIAL_TOKENS)
    write_json("tokenizer_config.json", {"tokenizer_class": "BertTokenizer", "do_lower_case": tokenizer.lowercase,
                                         "model_max_length": max_seq_length, **SPECIAL_TOKENS})

    # sentence-transformers: the encoder, the model's pooling, then the L2 normalisation that Embed applies.
    write_json("modules.json", [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}])
    write_json("sentence_bert_config.json", {"max_seq_length": max_seq_length, "do_lower_case": False})
    write_json("1_Pooling/config.json", {"word_embedding_dimension": enc.hidden_size,
                                         "pooling_mode_cls_token": model.config.pooling == "cls",
                                         "pooling_mode_mean_tokens": model.config.pooling == "mean",
                                         "pooling_mode_max_tokens": False, "include_prompt": True})
    (directory / "2_Normalize").mkdir()

    heads = {k: v.detach().float().contiguous() for k, v in model.state_dict().items() if k.startswith("heads.")}
    save_file(heads, str(directory / "heads.safetensors"), metadata={"format": "pt"})
    write_json("heads.json", {"tensors": "heads.safetensors (names heads.<task>.*)", "labels": labels,
                              "pooler": f"pooler.dense in model.safetensors: {pooler_source}; bertzoo pools "
                                        "last_hidden_state as 1_Pooling says",
                              "tasks": _head_recipes(model), "model_config": model.config.to_dict()})
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file())

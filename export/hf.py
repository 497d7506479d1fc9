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

The encoder mirrors HF's module names (trainer/model.py), so its state dict is a BertModel's without the pooler,
which nothing here uses (transformers initialises one and says so). An SSAF encoder (sparsegen-lin attention) has no
transformers counterpart and is refused.
"""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import save_file

from bertzoo.errors import UserError
from bertzoo.tokenization import Tokenizer
from bertzoo.trainer.heads import MultitaskModel

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


def write_hf(model: MultitaskModel, tokenizer: Tokenizer, tokenizer_file: Path, directory: Path,
             max_seq_length: int, labels: dict) -> list[str]:
    """Write the Hugging Face directory; returns the files written (relative to ``directory``)."""
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
    save_file({k: v.detach().float().contiguous() for k, v in model.encoder.state_dict().items()},
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
                              "tasks": _head_recipes(model), "model_config": model.config.to_dict()})
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file())

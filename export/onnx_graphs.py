"""torch -> ONNX for one multitask model: an encoder graph and one small graph per task head.

Why this split: the server runs one encoder pass over a batch that mixes sentences of every task, then each task's
rows through its head. Heads are tiny, so running them separately costs little and lets a batch be any task mix.

Graphs (dynamic ``batch`` and ``seq`` axes everywhere; masks are int64 1/0 like the tokenizer's):
- ``encoder.onnx``: input_ids, attention_mask, token_type_ids [batch, seq] -> last_hidden_state [batch, seq, hidden]
- ``head_sentiment.onnx``: states, mask -> logits [batch, labels]
- ``head_paraphrase.onnx`` / ``head_similarity.onnx``: states_a, mask_a, states_b, mask_b -> logit / score [batch]
- ``head_qa.onnx``: states, mask -> start_logits, end_logits [batch, seq]
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from pathlib import Path

import onnx
import torch
from torch import Tensor, nn

from bertzoo.trainer.heads import MultitaskModel

from . import sparsegen_onnx

log = logging.getLogger("bertzoo.export")

OPSET = 18  # >= 17 as asked; 18 because the SparsegenLin function body uses ReduceMax with axes as an input
# ONNX Runtime refuses models whose IR version is newer than it knows; 10 is read by every ORT since 1.17.
IR_VERSION = 10


@dataclass(frozen=True)
class GraphSpec:
    """What the manifest records about one graph: its file and its input/output names."""

    file: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


ENCODER = GraphSpec("encoder.onnx", ("input_ids", "attention_mask", "token_type_ids"), ("last_hidden_state",))
HEADS = {
    "sentiment": GraphSpec("head_sentiment.onnx", ("states", "mask"), ("logits",)),
    "paraphrase": GraphSpec("head_paraphrase.onnx", ("states_a", "mask_a", "states_b", "mask_b"), ("logits",)),
    "similarity": GraphSpec("head_similarity.onnx", ("states_a", "mask_a", "states_b", "mask_b"), ("scores",)),
    "qa": GraphSpec("head_qa.onnx", ("states", "mask"), ("start_logits", "end_logits")),
}


class _EncoderGraph(nn.Module):
    def __init__(self, model: MultitaskModel) -> None:
        super().__init__()
        self.encoder = model.encoder

    def forward(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor) -> Tensor:
        return self.encoder(input_ids, attention_mask, token_type_ids).last_hidden_state


def _export(module: nn.Module, args: tuple[Tensor, ...], spec: GraphSpec, dynamic: dict, out: Path) -> onnx.ModelProto:
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the exporter's own deprecation chatter, not about our model
        program = torch.onnx.export(
            module.eval(), args, dynamo=True, opset_version=OPSET, input_names=list(spec.inputs),
            output_names=list(spec.outputs), dynamic_shapes=dynamic, external_data=False,
            custom_translation_table=sparsegen_onnx.translation_table(), verbose=False,
        )
    model = program.model_proto
    if sparsegen_onnx.count_nodes(model):
        sparsegen_onnx.attach_function(model)
    model.ir_version = min(model.ir_version, IR_VERSION)
    onnx.checker.check_model(model, full_check=True)
    tmp = out / f".{spec.file}.tmp"
    onnx.save_model(model, str(tmp))
    tmp.replace(out / spec.file)  # atomic: a reader never sees half a graph
    return model


def export_graphs(model: MultitaskModel, out: Path) -> dict[str, GraphSpec]:
    """Write the encoder and every head of ``model`` to ``out``; returns {"encoder" | task: spec}."""
    out.mkdir(parents=True, exist_ok=True)
    model = model.float().eval()
    hidden = model.config.encoder.hidden_size
    max_len = model.config.encoder.max_position_embeddings
    batch, seq = torch.export.Dim("batch", min=1, max=4096), torch.export.Dim("seq", min=2, max=max_len)
    seq_b = torch.export.Dim("seq_b", min=2, max=max_len)  # a pair's two sentences are padded separately
    # Example inputs: batch 2 and length 16 so neither axis gets specialised to 1.
    ids = torch.randint(1000, 2000, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[1, 12:] = 0
    graphs = {"encoder": ENCODER}
    _export(_EncoderGraph(model), (ids, mask, torch.zeros_like(ids)), ENCODER,
            {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}, "token_type_ids": {0: batch, 1: seq}},
            out)
    states = torch.randn(2, 16, hidden)
    for task, head in model.heads.items():
        spec = HEADS[task]
        axes = {0: batch, 1: seq}
        if task in ("paraphrase", "similarity"):
            args = (states, mask, states[:, :11].flip(0), mask[:, :11].flip(0))
            axes_b = {0: batch, 1: seq_b}
            dynamic = {"states_a": axes, "mask_a": axes, "states_b": axes_b, "mask_b": axes_b}
        else:
            args, dynamic = (states, mask), {"states": axes, "mask": axes}
        _export(head, args, spec, dynamic, out)
        graphs[task] = spec
    log.info("exported %s to %s", ", ".join(s.file for s in graphs.values()), out)
    return graphs

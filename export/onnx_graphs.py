"""torch -> ONNX for one multitask model: an encoder graph and one small graph per task head.

Why this split: the server runs one encoder pass over a batch that mixes sentences of every task, then each task's
rows through its head. Heads are tiny, so running them separately costs little and lets a batch be any task mix.

Graphs (dynamic ``batch`` and ``seq`` axes everywhere; masks are int64 1/0 like the tokenizer's):
- ``encoder.onnx``: the batch's real tokens packed (``bertzoo.packing.PACKED_INPUTS``: input_ids, token_type_ids,
  position_ids, token_index [n], pad_index [batch * seq], attention_mask [batch, seq]) -> last_hidden_state
  [batch, seq, hidden]. Packed because nearly all the encoder's work is per token, and padding would pay for it too;
  bertzoo's own backends pack each batch (``bertzoo.packing.pack_batch``) before they run it.
- ``encoder.padded.onnx`` (only for TensorRT and Triton, which batch on a leading batch axis): input_ids,
  attention_mask, token_type_ids [batch, seq] -> last_hidden_state [batch, seq, hidden]
- ``head_sentiment.onnx``: states, mask -> logits [batch, labels]
- ``head_paraphrase.onnx`` / ``head_similarity.onnx``: states_a, mask_a, states_b, mask_b -> logit / score [batch]
- ``head_qa.onnx``: states, mask -> start_logits, end_logits [batch, seq]
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import torch
from torch import Tensor, nn

from bertzoo.artifact import ONNX_IR_VERSION
from bertzoo.packing import PACKED_INPUTS, pack_batch
from bertzoo.trainer.heads import MultitaskModel
from bertzoo.trainer.model import Packing

from . import sparsegen_onnx

log = logging.getLogger("bertzoo.export")

OPSET = 18  # >= 17 as asked; 18 because the SparsegenLin function body uses ReduceMax with axes as an input


@dataclass(frozen=True)
class GraphSpec:
    """What the manifest records about one graph: its file and its input/output names."""

    file: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


ENCODER = GraphSpec("encoder.onnx", PACKED_INPUTS, ("last_hidden_state",))
ENCODER_PADDED = GraphSpec("encoder.padded.onnx", ("input_ids", "attention_mask", "token_type_ids"),
                           ("last_hidden_state",))
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

    def forward(self, input_ids: Tensor, token_type_ids: Tensor, position_ids: Tensor, token_index: Tensor,
                pad_index: Tensor, attention_mask: Tensor) -> Tensor:
        packing = Packing(position_ids, token_index, pad_index)
        return self.encoder(input_ids, attention_mask, token_type_ids, packing=packing).last_hidden_state


class _PaddedEncoderGraph(_EncoderGraph):
    def forward(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor) -> Tensor:  # type: ignore[override]
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
    model.ir_version = min(model.ir_version, ONNX_IR_VERSION)
    onnx.checker.check_model(model, full_check=True)
    tmp = out / f".{spec.file}.tmp"
    onnx.save_model(model, str(tmp))
    tmp.replace(out / spec.file)  # atomic: a reader never sees half a graph
    return model


MAX_BATCH = 4096


def _example(model: MultitaskModel) -> tuple[Tensor, Tensor, dict]:
    """Example ids and mask (batch 2, length 16, one row padded, so no axis gets specialised) and the axes."""
    max_len = model.config.encoder.max_position_embeddings
    ids = torch.randint(1000, 2000, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[1, 12:] = 0
    axes = {"batch": torch.export.Dim("batch", min=1, max=MAX_BATCH),
            "seq": torch.export.Dim("seq", min=2, max=max_len),
            "seq_b": torch.export.Dim("seq_b", min=2, max=max_len)}  # a pair's two sentences are padded apart
    return ids, mask, axes


def export_padded_encoder(model: MultitaskModel, out: Path) -> GraphSpec:
    """Write ``encoder.padded.onnx``, the encoder on a [batch, seq] grid, for engines that batch on that axis."""
    ids, mask, axes = _example(model)
    grid = {0: axes["batch"], 1: axes["seq"]}
    _export(_PaddedEncoderGraph(model.float().eval()), (ids, mask, torch.zeros_like(ids)), ENCODER_PADDED,
            {"input_ids": grid, "attention_mask": grid, "token_type_ids": grid}, out)
    return ENCODER_PADDED


def export_graphs(model: MultitaskModel, out: Path) -> dict[str, GraphSpec]:
    """Write the (packed) encoder and every head of ``model`` to ``out``; returns {"encoder" | task: spec}."""
    out.mkdir(parents=True, exist_ok=True)
    model = model.float().eval()
    hidden = model.config.encoder.hidden_size
    ids, mask, axes = _example(model)
    batch, seq, seq_b = axes["batch"], axes["seq"], axes["seq_b"]
    packed = {k: torch.from_numpy(v) for k, v in pack_batch(
        {"input_ids": ids.numpy(), "attention_mask": mask.numpy(), "token_type_ids": np.zeros_like(ids.numpy())}
    ).items()}
    most = MAX_BATCH * model.config.encoder.max_position_embeddings
    tokens, cells = torch.export.Dim("tokens", min=2, max=most), torch.export.Dim("cells", min=2, max=most)
    dynamic = {name: {0: tokens} for name in PACKED_INPUTS[:4]}
    dynamic.update(pad_index={0: cells}, attention_mask={0: batch, 1: seq})
    graphs = {"encoder": ENCODER}
    _export(_EncoderGraph(model), tuple(packed[name] for name in PACKED_INPUTS), ENCODER, dynamic, out)
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

"""The CUDA graphs' bookkeeping, run on the CPU where nothing is captured (a replay runs the function again): which
graph a batch runs in, its inputs staged into the graph's static buffers, and its real rows' outputs cut from the
padded ones. tests/test_gpu.py runs the same object on CUDA, captured."""

from __future__ import annotations

import numpy as np
import torch
from test_gpu import batch, tiny_model

from bertzoo.trainer.cuda_graphs import GraphedEncoder, padded_rows


def test_batches_share_a_graph_by_padded_rows_and_answer_as_the_model_does():
    model = tiny_model()
    calls: list[tuple[int, ...]] = []

    def encode(inputs):
        calls.append(tuple(inputs["input_ids"].shape))
        return model.encode(inputs)

    graphs = GraphedEncoder(encode, torch.device("cpu"), max_rows=8)
    with torch.no_grad():
        for rows, length in ((8, 40), (5, 40), (1, 16), (3, 16)):  # 5 after 8: the padded rows hold the 8's rows
            inputs = batch(rows, length, seed=rows)
            got = graphs.encode(inputs)
            want = model.encode({k: torch.from_numpy(v) for k, v in inputs.items()}).numpy()
            real = inputs["attention_mask"].astype(bool)
            assert got.shape == want.shape and np.abs(got[real] - want[real]).max() < 1e-5
        assert graphs.shapes == [(1, 16), (4, 16), (8, 40)]
        assert calls == [(8, 40), (8, 40), (1, 16), (4, 16)]  # every batch ran at its graph's shape
        assert graphs.encode(batch(9, 16)) is None  # more rows than a graph holds: the caller runs it eagerly
        assert [padded_rows(n) for n in (1, 2, 3, 5, 64, 65)] == [1, 2, 4, 8, 64, 128]


def test_a_function_of_several_outputs_comes_back_cut_to_the_real_rows_on_the_host():
    model = tiny_model()
    graphs = GraphedEncoder(model.encode, torch.device("cpu"))

    def pooled_and_first(inputs):
        states = model.encode(inputs)
        return states.mean(dim=1), states[0::2, 0]  # per row, and per pair of rows

    inputs = batch(6, 16, seed=3)
    with torch.no_grad():
        per_row, per_pair = graphs.run(inputs, "pooled", pooled_and_first, keep=lambda rows: rows)[0], \
            graphs.run(inputs, "pooled", pooled_and_first, keep=lambda rows: rows // 2)[1]
        states = model.encode({k: torch.from_numpy(v) for k, v in inputs.items()})
    assert per_row.dtype == np.float32 and per_row.shape == (6, states.shape[-1])
    np.testing.assert_allclose(per_row, states.mean(dim=1).numpy(), atol=1e-5)
    np.testing.assert_allclose(per_pair, states[0::2, 0].numpy(), atol=1e-5)
    assert graphs.keys == [(8, 16, "pooled")]


def test_warm_up_captures_every_tasks_graph_at_each_bucket(tiny_artifact):
    """A lone request's first batch finds its graph of encoder and head captured: the warm-up runs every task (and
    Embed) as a one-task batch at each length bucket, one row, or one pair for the pair tasks."""
    from bertzoo.serving.model import load_served_model, warm_up
    from conftest import serve_config

    run, _ = tiny_artifact
    served = load_served_model(serve_config(run, backend="torch", device="cpu"))
    backend = served.backend
    backend.graphs = GraphedEncoder(backend._encode_tensors, torch.device("cpu"))  # nothing captured on the CPU
    warm_up(served)
    tasks = (*served.spec.tasks, "embed")
    pairs = ("paraphrase", "similarity")
    assert {key for key in backend.graphs.keys if key[2] is not None} == {
        (2 if task in pairs else 1, width, (task, served.spec.pooling))
        for width in served.spec.length_buckets for task in tasks}

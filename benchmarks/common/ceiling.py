"""The in-process ceiling, measured in the benchmark's own run: the rate the engine answers without a server in front
(batches cut as the server cuts them, at each setting of instances and batch size), so a server's rate can be stated
as a fraction of what its own engine does on these cores."""

from __future__ import annotations

import time
from pathlib import Path


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def in_process_rates(artifact: str, engine: str, engine_args: dict, sentences: list[str], threads: int,
                     tasks: tuple[str, ...] = ("sentiment", "embed"),
                     batch_sizes: tuple[int, ...] = (16, 64), only: str | None = None,
                     flush: bool = True) -> dict[tuple[str, str], dict]:
    """The in-process ceiling's candidates: sentences per second of the server's own batch computation
    (``serving.engine.run_batch``: the encoder, then the task's head or the pooling) on every sentence in
    length-sorted batches, no transport and no queue, under each setting that could be the fastest on these cores.
    Keys: (task, setting); values: ``rate``, the batches' ``padding_efficiency`` (real / padded tokens) and whether
    the setting pads ``as_served``. Settings: one engine on all ``threads``, or ``threads`` one-thread engines side by
    side (what ``--instances`` does); batches of each of ``batch_sizes`` rows (smaller ones can be faster on a CPU:
    their activations stay in cache); rows padded to the batch's longest, or as the server pads them (rounded up to a
    multiple of 8); for ONNX Runtime its thread spinning on and off. Each rate is the best of two passes: one pass is
    a few seconds, and the machine is shared. The ceiling is the best of them all. ``only``: measure just the setting of
    that name (a key's second half), as chosen by an earlier call. ``flush``: the engines' threads flush denormals to
    zero, as a server's do (serving/workers.py)."""
    from concurrent import futures

    from bertzoo.artifact import load_manifest
    from bertzoo.cpu import flush_denormals
    from bertzoo.pipeline import length_sorted_batches
    from bertzoo.serving.backends import create_backend
    from bertzoo.serving.engine import Work, prepare_inputs, run_batch
    from bertzoo.tokenization import Tokenizer, pad_batch

    manifest = load_manifest(artifact)
    tokenizer = Tokenizer.from_file(Path(artifact) / manifest["tokenizer"])
    encodings = tokenizer.encode_sentences(sentences, manifest["limits"]["max_seq_length"])
    pooling = manifest["model"]["pooling"]
    paddings = {"padded to the longest row": lambda works: pad_batch([w.rows[0] for w in works], tokenizer.pad_id),
                "padded as the server pads": lambda works: prepare_inputs(works, None, tokenizer.pad_id)}

    def batches(task: str, pad, share: list[int], rows: int):
        for idx in length_sorted_batches([len(encodings[i].input_ids) for i in share], rows):
            works = [Work(task, (encodings[share[i]],)) for i in idx]
            yield works, pad(works)

    def run(backend, task: str, pad, share: list[int], rows: int) -> None:
        for works, inputs in batches(task, pad, share, rows):
            run_batch(backend, works, inputs, pooling)

    def rate(backends: list, task: str, pad, rows: int) -> float:
        """Every sentence, the engines side by side on their shares of them."""
        for backend in backends:
            run(backend, task, pad, list(range(min(64, len(sentences)))), rows)  # warm-up
        shares = [list(range(i, len(sentences), len(backends))) for i in range(len(backends))]
        n = len(backends)
        with futures.ThreadPoolExecutor(n, initializer=flush_denormals if flush else None) as pool:
            best = min(timed(lambda: list(pool.map(run, backends, [task] * n, [pad] * n, shares, [rows] * n)))
                       for _ in range(2))
        return len(sentences) / best

    def padding_efficiency(pad, rows: int) -> float:
        masks = [inputs["attention_mask"] for _, inputs in batches("embed", pad, list(range(len(sentences))), rows)]
        return sum(int(m.sum()) for m in masks) / sum(m.size for m in masks)

    efficiency = {(rows, padding): padding_efficiency(pad, rows) for rows in batch_sizes
                  for padding, pad in paddings.items()}
    found: dict[tuple[str, str], dict] = {}
    for spinning in ([True, False] if engine == "onnxruntime" else [None]):
        extra = {} if spinning is None else {"spinning": spinning}
        for instances in sorted({1, threads}):
            named = [(rows, padding, f"{instances} engine(s), batches of {rows}, {padding}" + (
                "" if spinning is None else f", spinning {'on' if spinning else 'off'}"))
                for rows in batch_sizes for padding in paddings]
            wanted = [(rows, padding, setting) for rows, padding, setting in named if only in (None, setting)]
            if not wanted:
                continue
            with futures.ThreadPoolExecutor(1, initializer=flush_denormals if flush else None) as builder:
                # built on a thread that flushes as the measuring ones do: ONNX Runtime's pool threads follow it
                backends = [builder.submit(create_backend, engine, artifact, threads=max(1, threads // instances),
                                           manifest=manifest, **engine_args, **extra).result()
                            for _ in range(instances)]
            for task in tasks:
                for rows, padding, setting in wanted:
                    found[(task, setting)] = {"rate": rate(backends, task, paddings[padding], rows),
                                              "padding_efficiency": efficiency[(rows, padding)],
                                              "as_served": padding == "padded as the server pads"}
    if not found:
        raise ValueError(f"no setting named {only!r}")
    return found

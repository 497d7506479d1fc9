"""CPU engines side by side in one run: each engine and precision's encoder rate against the machine's measured GEMM
peak, and `bertzoo serve` on each against its in-process ceiling.

    python benchmarks/cpu_engines.py ARTIFACT --data ../shared/data/ids-sst-dev.csv [--threads 2] [--serve-seconds 20]

ARTIFACT: a `bertzoo export --int8` output. Engines: ONNX Runtime fp32 and int8 (the artifact's variants), OpenVINO
fp32, and OpenVINO bf16 where the CPU computes bf16 natively (AVX-512 BF16 or AMX). The encoder runs on every SST
dev sentence in length-sorted batches of 64 through the engine as the server makes it (`create_backend`), twice,
engines alternating; the best of the two rounds counts. Its work is counted in FLOPs (every layer's matrix products
and attention, padding included) and set against the peak of one large matrix product of the engine's precision on
the same threads (ONNX Runtime's MatMul in fp32, and dynamically quantized for int8; bf16 against fp32, since no
bf16 product runs here to measure), the best of a measurement before and after the engines. Then each engine serves
Sentiment to 64 closed-loop clients for --serve-seconds.

--nncf-calibration SST_TRAIN adds an in-process row the server does not offer: the encoder quantized to int8 by
OpenVINO's own tool (NNCF, post-training, 300 training sentences), to see whether it is worth offering on this CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
from ceiling import encoder_flops, gemm_peak_gflops, timed
from processes import start_bertzoo, stop
from server_loads import closed_loop
from timing import machine

from bertzoo.artifact import load_manifest
from bertzoo.cpu import native_bf16
from bertzoo.serving.backends import create_backend
from bertzoo.serving.backends.base import encoder_feed
from bertzoo.serving.load import load_items
from bertzoo.tokenization import Tokenizer, pad_batch

ENGINES = [("onnxruntime", "fp32"), ("onnxruntime", "int8"), ("openvino", "fp32"), ("openvino", "bf16")]


class NncfInt8Encoder:
    """The artifact's encoder quantized by NNCF and compiled by OpenVINO (encode only: a benchmark row)."""

    def __init__(self, artifact: str, threads: int, calibration: str, tokenizer: Tokenizer, max_length: int) -> None:
        import nncf
        import openvino as ov

        texts = load_items("sentiment", calibration)[:300]
        encodings = tokenizer.encode_sentences(texts, max_length)
        core = ov.Core()
        model = core.read_model(str(Path(artifact) / "encoder.onnx"))
        self._inputs = [name for port in model.inputs for name in port.get_names()]
        dataset = [encoder_feed(pad_batch(encodings[i:i + 8], tokenizer.pad_id, pad_to_multiple_of=8), self._inputs)
                   for i in range(0, len(encodings), 8)]
        started = time.perf_counter()
        quantized = nncf.quantize(model, nncf.Dataset(dataset), model_type=nncf.ModelType.TRANSFORMER,
                                  subset_size=len(dataset))
        self.quantize_seconds = time.perf_counter() - started
        compiled = core.compile_model(quantized, "CPU", {"INFERENCE_NUM_THREADS": threads,
                                                         "PERFORMANCE_HINT": "LATENCY"})
        self._request = compiled.create_infer_request()

    def encode(self, batch: dict) -> np.ndarray:
        self._request.infer(encoder_feed(batch, self._inputs))
        return np.array(self._request.get_output_tensor(0).data)


def make(engine: str, precision: str, artifact: str, threads: int):
    if engine == "openvino":
        return create_backend("openvino", artifact, precision=precision, threads=threads)
    return create_backend("onnxruntime", artifact, variant=precision, threads=threads)


def serve_rate(artifact: str, engine: str, precision: str, threads: int, sentences: list[str], seconds: float,
               port: int) -> dict:
    flags = ["--backend", engine, *(["--precision", precision] if engine == "openvino" else ["--variant", precision])]
    server = start_bertzoo(artifact, port, *flags, "--threads", str(threads))
    try:
        return closed_loop(port, "sentiment", sentences, 64, seconds)
    finally:
        stop(server)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact")
    parser.add_argument("--data", required=True)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--serve-seconds", type=float, default=20.0)
    parser.add_argument("--port", type=int, default=50791)
    parser.add_argument("--nncf-calibration", help="SST training file: add an NNCF int8 OpenVINO row (in-process)")
    parser.add_argument("--out")
    args = parser.parse_args()
    manifest = load_manifest(args.artifact)
    encoder = manifest["model"]["encoder"]
    tokenizer = Tokenizer.from_file(Path(args.artifact) / manifest["tokenizer"])
    sentences = load_items("sentiment", args.data)
    encodings = sorted(tokenizer.encode_sentences(sentences, manifest["limits"]["max_seq_length"]),
                       key=lambda e: len(e.input_ids))
    batches = [pad_batch(encodings[i:i + 64], tokenizer.pad_id, pad_to_multiple_of=8)
               for i in range(0, len(encodings), 64)]
    flops = encoder_flops([b["input_ids"].shape for b in batches], encoder["num_hidden_layers"],
                          encoder["hidden_size"], encoder["intermediate_size"])
    engines = [(e, p) for e, p in ENGINES if not (e == "openvino" and p == "bf16" and not native_bf16())]
    results: dict = {**machine(), "threads": args.threads, "sentences": len(encodings), "encoder_gflop": flops / 1e9}
    results["gemm_peak_gflops"] = {p: gemm_peak_gflops(args.threads, p) for p in ("fp32", "int8")}
    backends = {f"{e}/{p}": make(e, p, args.artifact, args.threads) for e, p in engines}
    if args.nncf_calibration:
        backends["openvino/int8-nncf"] = NncfInt8Encoder(args.artifact, args.threads, args.nncf_calibration,
                                                         tokenizer, manifest["limits"]["max_seq_length"])
        results["nncf_quantize_seconds"] = backends["openvino/int8-nncf"].quantize_seconds
    seconds: dict[str, list[float]] = {name: [] for name in backends}
    for _ in range(2):
        for name, backend in backends.items():
            backend.encode(batches[len(batches) // 2])
            seconds[name].append(timed(lambda b=backend: [b.encode(x) for x in batches]))
    peaks = results["gemm_peak_gflops"]
    for precision in peaks:  # a busy moment of a shared machine makes one measurement low: keep the best
        peaks[precision] = max(peaks[precision], gemm_peak_gflops(args.threads, precision))
    print(f"GEMM peak ({args.threads} threads): fp32 {peaks['fp32']:.0f} GFLOP/s, int8 {peaks['int8']:.0f}", flush=True)
    rows = []
    for name, times in seconds.items():
        best, peak = min(times), peaks["int8" if "int8" in name else "fp32"]
        rows.append({"engine": name, "sentences_per_s": len(encodings) / best, "gflops": flops / best / 1e9,
                     "fraction_of_gemm_peak": flops / best / 1e9 / peak})
        print(f"{name:20} {rows[-1]['sentences_per_s']:7.1f} sentences/s  {rows[-1]['gflops']:6.1f} GFLOP/s  "
              f"{rows[-1]['fraction_of_gemm_peak']:.2f} of its precision's GEMM peak", flush=True)
    results["in_process"] = rows
    del backends
    for row in rows:
        engine, precision = row["engine"].split("/")
        if precision == "int8-nncf":
            continue  # the server does not offer it
        summary = serve_rate(args.artifact, engine, precision, args.threads, sentences, args.serve_seconds, args.port)
        row["served_sentences_per_s"] = summary["items_per_s"]
        row["served_p50_ms"], row["served_p99_ms"] = summary["p50_ms"], summary["p99_ms"]
        row["served_fraction_of_in_process"] = summary["items_per_s"] / row["sentences_per_s"]
        print(f"{row['engine']:20} served {summary['items_per_s']:7.1f} sentences/s "
              f"({row['served_fraction_of_in_process']:.2f} of in-process), p50 {summary['p50_ms']:.0f} ms, "
              f"p99 {summary['p99_ms']:.0f} ms", flush=True)
    print(json.dumps(results, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

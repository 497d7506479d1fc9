"""Everything a GPU machine should verify, in one run: parity and speed of every GPU path against the CPU reference.

    python -m benchmarks.gpu_check RUN --data DATA_DIR --out WORK_DIR [--json results.json]

RUN is a `bertzoo train` run (or checkpoint) directory; DATA_DIR holds the dev files (`ids-sst-dev.csv`, ...). Needs a
CUDA build of torch (with triton) and this package; onnxruntime-gpu for the ONNX Runtime rows. TensorRT rows run only
where the `tensorrt` package is installed. Each check runs on its own: one that fails is reported (with the reason)
and the others still run. Prints one table at the end; --json writes every figure.

1. environment: GPU, driver, CUDA, torch, triton, onnxruntime and its providers;
2. the SparsegenLin Triton kernel against the sort-based reference (float64, CPU), and its speed;
3. parity of every GPU backend (torch fp32 / fp16 / bf16, with and without CUDA graphs; ONNX Runtime CUDA; TensorRT)
   against the PyTorch CPU model, through the export's gates (`export/gates.py`) on real dev data;
4. encoder latency at b1/s32, b8/s128, b32/s64 and b1/s128 for each backend and precision;
5. SSAF (sparsegen-lin, lambda -3) against softmax, same weights, on each GPU engine;
6. `bertzoo serve` on the GPU: end-to-end b1/s128 latency, and 64-client throughput against the in-process ceiling.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import torch

from benchmarks.common.timing import machine
from bertzoo import pipeline
from bertzoo.data import SentenceExample
from bertzoo.serving.load import load_items, run_load

SHAPES = ((1, 32), (8, 128), (32, 64), (1, 128))
SSAF_LAMBDA = -3.0
results: dict[str, dict] = {}
JSON_OUT: list[Path] = []  # where results are written after every check, so a run cut short still leaves them


def check(name: str):
    """Run a check, keep its figures (or its error) under ``name``, never stop the script."""
    def wrap(fn):
        def run(*args, **kwargs):
            started = time.perf_counter()
            print(f"== {name}", flush=True)
            try:
                results[name] = {"ok": True, **(fn(*args, **kwargs) or {})}
            except Exception as e:  # noqa: BLE001 - every failure is a row of the report
                traceback.print_exc()
                results[name] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:600]}
            results[name]["seconds"] = round(time.perf_counter() - started, 1)
            print(json.dumps(results[name], default=str)[:1500], flush=True)
            for path in JSON_OUT:
                path.write_text(json.dumps(results, indent=2, default=str))
        return run
    return wrap


@check("environment")
def environment() -> dict:
    info = {**machine(), "torch": torch.__version__, "cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name(0),
            "capability": ".".join(map(str, torch.cuda.get_device_capability(0)))}
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                          "--format=csv,noheader"], capture_output=True, text=True)
    info["nvidia_smi"] = smi.stdout.strip()
    for module in ("triton", "onnxruntime", "tensorrt"):
        try:
            info[module] = __import__(module).__version__
        except ImportError as e:
            info[module] = f"not installed ({e})"
    try:
        import onnxruntime as ort

        info["ort_providers"] = ort.get_available_providers()
    except ImportError:
        pass
    flags = Path("/proc/cpuinfo").read_text().split("flags")[1].split("\n")[0]
    info["cpu_flags"] = " ".join(f for f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile")
                                 if f" {f}" in flags)
    info["cpu_cores"] = os.cpu_count()
    return info


def gpu_time(fn, warmup: int = 10, repeat: int = 100) -> float:
    """Median milliseconds of ``fn()``, synchronizing around each call (host-side wall time: what a caller waits)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return float(np.median(times) * 1000)


@check("sparsegen Triton kernel")
def triton_kernel() -> dict:
    from bertzoo.export.sparsegen_gpu_kernel import sparsegen_lin_triton
    from bertzoo.trainer.sparsegen import _sparsegen_lin_eager, masked_softmax, sparsegen_lin

    worst, gen = 0.0, torch.Generator().manual_seed(0)
    for (b, h, q, k) in ((2, 12, 37, 37), (4, 12, 128, 128), (1, 2, 5, 512), (3, 1, 1, 1)):
        scores = torch.randn(b, h, q, k, generator=gen) * 4
        mask = torch.rand(b, 1, 1, k, generator=gen) > 0.3
        mask[..., 0] = True
        for lam in (-3.0, 0.0, 0.5):
            ref = sparsegen_lin(scores.double(), mask, lam, "sort")
            got = sparsegen_lin_triton(scores.cuda(), mask.cuda(), lam).double().cpu()
            worst = max(worst, float((got - ref).abs().max()))
    scores = torch.randn(32, 12, 128, 128, device="cuda")
    mask = torch.ones(32, 1, 1, 128, dtype=torch.bool, device="cuda")
    times = {"triton_ms": gpu_time(lambda: sparsegen_lin_triton(scores, mask, SSAF_LAMBDA)),
             "eager_bisect_ms": gpu_time(lambda: _sparsegen_lin_eager(scores, mask, SSAF_LAMBDA, "bisect")),
             "softmax_ms": gpu_time(lambda: masked_softmax(scores, mask))}
    return {"max_abs_err_vs_float64_sort": worst, "passed": worst < 1e-5, "shape_b32_h12_s128": times}


def load_run(run: str):
    from bertzoo.tokenization import Tokenizer
    from bertzoo.trainer.checkpoint import TOKENIZER, load_model
    from bertzoo.trainer.config import TrainConfig

    model, saved, directory = load_model(run)
    return model.float().eval(), Tokenizer.from_file(directory / TOKENIZER), TrainConfig.from_dict(saved["train"]), \
        directory


def ssaf_checkpoint(directory: Path, out: Path) -> Path:
    """A copy of the checkpoint whose encoder uses sparsegen-lin: same weights, so speed and parity compare fairly."""
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(directory, out)
    config = json.loads((out / "config.json").read_text())
    config["model"]["encoder"].update(attention="sparsegen_lin", sparsegen_lambda=SSAF_LAMBDA, sparsegen_impl="bisect")
    (out / "config.json").write_text(json.dumps(config))
    return out


def torch_backends(run: str) -> dict:
    """name -> (backend factory, parity bounds)."""
    from bertzoo.serving.backends import create_backend

    def make(precision: str, graphs: bool):
        def build():
            model = load_run(run)[0]
            return create_backend("torch", model.cuda().eval(), device="cuda", precision=precision, cuda_graphs=graphs)
        return build

    out = {}
    for precision in ("fp32", "fp16", "bf16"):
        bounds = precision  # export/gates.py's bounds for that precision
        out[f"torch {precision}"] = (make(precision, False), bounds)
        out[f"torch {precision} + CUDA graphs"] = (make(precision, True), bounds)
    return out


def ort_backends(artifact: Path) -> dict:
    from bertzoo.serving.backends import create_backend

    def make(sparsegen: str):
        return lambda: create_backend("onnxruntime", artifact, device="cuda", sparsegen=sparsegen)

    return {"onnxruntime CUDA fp32 (function body)": (make("function"), "fp32"),
            "onnxruntime CUDA fp32 (ORT formulation)": (make("formulation"), "fp32")}


def trt_backends(artifact: Path) -> dict:
    from bertzoo.artifact import load_manifest
    from bertzoo.serving.backends import create_backend

    manifest = load_manifest(artifact)
    if "tensorrt_fp16" not in manifest["graphs"]["encoder"]["files"]:
        return {}
    return {"tensorrt fp16": (lambda: create_backend("tensorrt", artifact, manifest=manifest), "fp16")}


def sample(batch: int, seq: int) -> dict[str, np.ndarray]:
    from bertzoo.parity_measures import _sample_batch

    return _sample_batch(batch, seq, 30522, seed=batch * 1000 + seq)


def cache_reference_outputs() -> None:
    """gates.check runs the CPU reference model on every call; here ~16 backends share one reference per model, so
    its outputs are computed once per distinct input (same numbers, minutes less of GPU-machine time)."""
    import torch

    from bertzoo.export import gates
    from bertzoo.serving.backends import TorchBackend

    cache: dict = {}

    def key(*parts) -> tuple:
        return tuple((k, v.shape, v.dtype.str, hash(v.tobytes())) if isinstance(v, np.ndarray) else (k, v)
                     for k, v in parts)

    class CachedReference(TorchBackend):
        def encode(self, batch):
            k = key(("model", id(self.model)), ("op", "encode"), *sorted(batch.items()))
            if k not in cache:
                cache[k] = super().encode(batch)
            return cache[k]

        def head(self, task, inputs):
            k = key(("model", id(self.model)), ("op", task), *sorted(inputs.items()))
            if k not in cache:
                cache[k] = super().head(task, inputs)
            return cache[k]

    def reference(name, model, *, device, **_):  # the gates' one call: create_backend("torch", model, device="cpu")
        assert name == "torch", name
        return CachedReference(model, torch.device(device))

    gates.create_backend = reference


def backend_rows(label: str, run: str, backends: dict, splits, tokenizer, limits) -> None:
    cpu_model = load_run(run)[0]
    for name, (build, bounds) in backends.items():
        check(f"{label}: {name}")(backend_row)(cpu_model, build, bounds, splits, tokenizer, limits)


def backend_row(cpu_model, build, bounds: str, splits, tokenizer, limits) -> dict:
    from bertzoo.export import gates

    backend = build()
    try:
        report = gates.check(cpu_model, backend, bounds, splits, tokenizer, limits)
    except gates.ParityError as e:
        report = e.report
    latency = {}
    for b, t in SHAPES:
        inputs = sample(b, t)
        latency[f"b{b}/s{t}"] = gpu_time(lambda inputs=inputs: backend.encode(inputs), repeat=50)
    return {"parity_passed": report["passed"], "failures": report["failures"],
            "tensor_max_abs": report["tensor_max_abs"], "tasks": report["tasks"], "encoder_ms": latency}


def ort_placement(artifact: Path) -> dict:
    """Nodes per execution provider in the encoder as ONNX Runtime CUDA runs it (from its profile)."""
    import onnx
    import onnxruntime as ort

    from bertzoo.export import ort_kernel
    from bertzoo.serving.backends import ort_providers, provider_names, session_options
    from bertzoo.serving.backends.base import encoder_feed

    manifest = json.loads((artifact / "manifest.json").read_text())
    providers = ort_providers("cuda")
    placement = {}
    for choice in ("function", "formulation"):
        options = session_options()
        options.enable_profiling = True
        options.profile_file_prefix = str(artifact.parent / f"profile_{choice}")
        model = onnx.load(str(artifact / manifest["graphs"]["encoder"]["files"]["fp32"]))
        models, _ = ort_kernel.prepare({"encoder": model}, options, provider_names(providers), choice)
        session = ort.InferenceSession(models["encoder"].SerializeToString(), options, providers=providers)
        session.run(None, encoder_feed(sample(8, 128), [i.name for i in session.get_inputs()]))
        events = json.loads(Path(session.end_profiling()).read_text())
        counts: dict[str, dict[str, int]] = {}
        for event in events:
            args = event.get("args", {})
            if event.get("cat") == "Node" and "provider" in args and event["name"].endswith("_kernel_time"):
                ops = counts.setdefault(args["provider"], {})
                ops[args.get("op_name", "?")] = ops.get(args.get("op_name", "?"), 0) + 1
        placement[choice] = counts
    return placement


def resident_states(artifact: Path, sentences: list[str]) -> dict:
    """One served batch (run_batch: encoder + sentiment, similarity and embed rows) on ORT CUDA, with the encoder's
    states kept on the GPU between encoder and heads (I/O binding) and copied through the host, side by side."""
    from bertzoo import tasks as T
    from bertzoo.serving.backends import create_backend
    from bertzoo.serving.engine import EMBED, Work, prepare_inputs, run_batch
    from bertzoo.tokenization import Tokenizer

    tokenizer = Tokenizer.from_file(artifact / "tokenizer.json")
    encoded = T.encode_sentences(tokenizer, sentences[:48], T.Limits())
    works = [Work("sentiment", (e,)) for e in encoded[:16]] + [Work(EMBED, (e,)) for e in encoded[16:32]]
    works += [Work("similarity", (a, b)) for a, b in zip(encoded[32:40], encoded[40:48], strict=True)]
    inputs = prepare_inputs(works, 128, tokenizer.pad_id)
    result = {}
    for resident in (True, False):
        backend = create_backend("onnxruntime", artifact, device="cuda", resident_states=resident)
        result["resident_ms" if resident else "host_ms"] = gpu_time(lambda b=backend: run_batch(b, works, inputs, "mean"))
    result["host_over_resident"] = result["host_ms"] / result["resident_ms"]
    return result


def cuda_ceiling(run: str, sentences: list[str], seconds: float = 3.0, device: str = "cuda") -> dict:
    """Sentiment sentences/s of the torch engine in this process as `bertzoo serve --device cuda` runs it (fp16, CUDA
    graphs, batches of 64, the server's largest): the in-process ceiling a server on the GPU is held against. A pass
    over ~1,000 sentences takes ~0.1 s, and one pass varied from 11,600 to 14,700/s on one machine, so the ceiling
    ("best") is the fastest of at least 5 passes over ``seconds``; "median" and every pass's rate come with it.

    Beside it, best and median of as many passes each: "engine", the same sentences through the server's engine
    path (tokenized, then in length-sorted batches of 64 padded as the batcher pads and run by ``run_batch``: on CUDA
    the encoder and the Sentiment head as one graph; "engine_heads_eager", on CUDA, the same with the head run after
    the encoder's graph), and "model", the encoder alone on the pipeline's batches (tokenized and
    padded beforehand, states left where the backend keeps them). The gaps say what tokenization, padding, copies,
    heads and post-processing cost. ``device="cpu"``: the same measures of the fp32 engine without graphs, so the GPU
    steps can be run through on a machine without a GPU."""
    from bertzoo.serving.backends import create_backend
    from bertzoo.serving.engine import Work, encoded_states, prepare_inputs, run_batch
    from bertzoo.tasks import encode_sentences
    from bertzoo.tokenization import pad_batch

    cuda = device == "cuda"
    model, tokenizer, config, _ = load_run(run)
    backend = create_backend("torch", model.to(device).eval(), device=device, precision="fp16" if cuda else "fp32",
                             cuda_graphs=cuda)
    examples = [SentenceExample(str(i), s, None) for i, s in enumerate(sentences)]
    pipeline.predict(backend, "sentiment", examples, tokenizer, config.limits, 64)  # captures the graphs
    encodings = encode_sentences(tokenizer, sentences, config.limits)
    # The batches pipeline.encode_states runs: sorted by length, each padded to its longest.
    batches = [pad_batch([encodings[i] for i in idx], tokenizer.pad_id)
               for idx in pipeline.length_sorted_batches([len(e.input_ids) for e in encodings], 64)]

    def passes(one_pass) -> list[float]:
        rates: list[float] = []
        end = time.perf_counter() + seconds
        while len(rates) < 5 or time.perf_counter() < end:
            started = time.perf_counter()
            one_pass()
            if cuda:
                torch.cuda.synchronize()
            rates.append(len(sentences) / (time.perf_counter() - started))
        return rates

    def model_alone() -> None:
        for batch in batches:
            encoded_states(backend, batch)

    def engine_path() -> None:
        works = [Work("sentiment", (e,)) for e in encode_sentences(tokenizer, sentences, config.limits)]
        for idx in pipeline.length_sorted_batches([len(w.rows[0].input_ids) for w in works], 64):
            batch = [works[i] for i in idx]
            run_batch(backend, batch, prepare_inputs(batch, None, tokenizer.pad_id), model.config.pooling)

    def summary(rates: list[float]) -> dict:
        return {"best": max(rates), "median": float(np.median(rates)), "passes": rates}

    found = summary(passes(lambda: pipeline.predict(backend, "sentiment", examples, tokenizer, config.limits, 64)))
    found["engine"] = summary(passes(engine_path))
    if cuda:  # the engine path with the heads run after the encoder's graph instead of inside it
        backend.graph_heads = False
        found["engine_heads_eager"] = summary(passes(engine_path))
        backend.graph_heads = True
    found["model"] = summary(passes(model_alone))
    backend = model = None  # freed before the cache is emptied
    if cuda:
        torch.cuda.empty_cache()
    return found


def served(run: str, sentences: list[str], work: Path) -> dict:
    """`bertzoo serve` (torch, fp16, CUDA graphs) in a process of its own; the load generator in another."""
    from bertzoo.serving.client import BertzooClient

    ceiling = cuda_ceiling(run, sentences)["best"]
    port = 50000 + os.getpid() % 10000
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cli = [sys.executable, "-c", "from bertzoo.cli import main; main()"]
    server = subprocess.Popen([*cli, "serve", run, "--backend", "torch", "--device", "cuda", "--port", str(port),
                               "--metrics-port", "0", "--http-port", "0", "--host", "127.0.0.1"], cwd=work, env=env,
                              stdout=subprocess.DEVNULL, stderr=open(work / "server.log", "w"))
    target = f"127.0.0.1:{port}"
    try:
        with BertzooClient(target, timeout=300) as client:
            client.wait_ready(timeout=300)
            info = client.model_info()
            long_text = " ".join(sentences[i] for i in range(40))[:2000]  # truncated to the model's 128 tokens
            for _ in range(20):
                client.sentiment([long_text])
            e2e = []
            for _ in range(200):
                t0 = time.perf_counter()
                client.sentiment([long_text])
                e2e.append(time.perf_counter() - t0)
        load = asyncio.run(run_load(target, "sentiment", sentences, concurrency=64, duration=15.0)).summary()
    finally:
        server.terminate()
        server.wait(60)
    return {"model_info": {"backend": info.backend, "device": info.device, "precision": info.precision},
            "served_b1_s128_p50_ms": float(np.median(e2e) * 1000),
            "served_b1_s128_p99_ms": float(np.percentile(e2e, 99) * 1000),
            "in_process_ceiling_sentences_per_s": ceiling, "server_sentences_per_s": load["items_per_s"],
            "server_over_ceiling": load["items_per_s"] / ceiling, "load": load}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run")
    parser.add_argument("--data", required=True)
    parser.add_argument("--out", required=True, help="Work directory (artifacts, profiles, server log).")
    parser.add_argument("--parity-limit", type=int, default=300)
    parser.add_argument("--json", default=None)
    parser.add_argument("--skip", default="",
                        help="Comma-separated sections to skip: torch (its backend rows), ort, serve, ssaf.")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    if not torch.cuda.is_available():
        sys.exit("gpu_check needs a CUDA GPU and a CUDA build of torch; torch.cuda.is_available() is False")
    work = Path(args.out)
    work.mkdir(parents=True, exist_ok=True)
    if args.json:
        JSON_OUT.append(Path(args.json))
    cache_reference_outputs()
    environment()
    triton_kernel()

    from bertzoo.export.exporter import ExportOptions, export_checkpoint
    from bertzoo.trainer.training_data import load_splits

    model, tokenizer, config, directory = load_run(args.run)
    config.data_dir = args.data
    splits = load_splits(config, "dev", args.parity_limit)
    ssaf = ssaf_checkpoint(directory, work / "ssaf-checkpoint")
    artifacts = {}
    for label, source in (("softmax", str(directory)), ("ssaf", str(ssaf))):
        if label == "ssaf" and "ssaf" in skip:
            continue
        backends = torch_backends(source) if "torch" not in skip else {}
        if "ort" not in skip:
            @check(f"export {label} (CPU)")
            def export(source=source, label=label) -> dict:
                trt = False
                try:
                    import tensorrt  # noqa: F401
                    trt = True
                except ImportError:
                    pass
                artifacts[label] = work / f"artifact-{label}"
                manifest = export_checkpoint(source, artifacts[label], ExportOptions(
                    data_dir=args.data, parity_limit=100, force=True, trt=trt))
                return {"files": len(manifest["files"]), "tensorrt": trt}
            export()
            if label in artifacts:
                backends.update(ort_backends(artifacts[label]))
                backends.update(trt_backends(artifacts[label]))
                check(f"ORT CUDA placement, {label}")(lambda a=artifacts[label]: ort_placement(a))()
                sentences = load_items("sentiment", str(Path(args.data) / "ids-sst-dev.csv"))
                check(f"ORT CUDA run_batch, states on the GPU vs through the host, {label}")(
                    lambda a=artifacts[label], s=sentences: resident_states(a, s))()
        backend_rows(label, source, backends, splits, tokenizer, config.limits)
    if "serve" not in skip:
        sentences = load_items("sentiment", str(Path(args.data) / "ids-sst-dev.csv"))
        check("bertzoo serve, torch fp16 + CUDA graphs")(lambda: served(str(directory), sentences, work))()

    print("\n| check | ok | parity | b1/s32 ms | b8/s128 ms | b32/s64 ms | b1/s128 ms |")
    print("|---|---|---|---|---|---|---|")
    for name, r in results.items():
        ms = r.get("encoder_ms", {})
        cells = [f"{ms[k]:.3f}" if k in ms else "-" for k in ("b1/s32", "b8/s128", "b32/s64", "b1/s128")]
        parity = {True: "pass", False: "FAIL"}.get(r.get("parity_passed"), "-")
        print(f"| {name} | {'yes' if r['ok'] else 'NO: ' + r['error'][:80]} | {parity} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()

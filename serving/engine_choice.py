"""``bertzoo serve``'s ``--backend auto --variant auto`` (and ``--instances auto``) on the CPU, chosen by measurement:
CPU flags do not predict which engine is fastest across CPU vendors and generations (bf16 dot products differ between
Cooper Lake, Zen 4 and AMX), nor across models and lengths. Figures: benchmarks/RESULTS.md, "Serving on CPU" ("The
defaults, measured").

At the first start of an artifact on a machine, every engine that keeps fp32-level agreement is timed on the
artifact's own model, through the server's batch path, on batches of the bundled SST dev sentences (one-sentence
requests batched by a loaded server), each instance on its own thread placed as the server places it:

1. each eligible engine at the instance layout of the core rule (``machine_defaults.instances``), then
2. the fastest of them at the other layouts (one instance on every core), where there is another,

``SECONDS_PER_CANDIDATE`` each after a warm-up batch: about 15 s on 2 cores, logged. The fastest serves. Eligible:

- ONNX Runtime fp32 always; optimized and int8 where the export's parity report meets fp32's task bounds
  (``machine_defaults.fp32_level_variants``: same class, Pearson and F1 as ``parity_measures.missed_bounds``
  computes them: the 95% Wilson *upper* bound of the same-class share at least 99.5%, so 2 disagreements in 200
  items pass; Pearson within 0.002; SQuAD F1 within 0.5);
- OpenVINO fp32 where OpenVINO is installed, and bf16 where the CPU also has native bf16, each where its start-up gate
  (``startup_gate.check_backend`` on the bundled dev rows of every task the artifact serves, QA included) passes and
  shows the same fp32 task bounds.

The choice is cached in ``~/.cache/bertzoo/engine-choice/`` keyed by the CPU model and flags, the usable cores, the
engine libraries' versions, the forced settings and the artifact's manifest sha256: a later start reads it in
milliseconds; any change of key measures again, and so does ``bertzoo serve --retune``. A measurement that fails
falls back to the flag rules (``machine_defaults``) with one log line.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bertzoo.artifact import load_manifest
from bertzoo.atomic import atomic_write_text
from bertzoo.cpu import cpu_flags, cpu_model, native_bf16
from bertzoo.datafiles import load_split, samples_dir
from bertzoo.parity_measures import BOUNDS, missed_bounds
from bertzoo.tasks import Limits, encode_sentences
from bertzoo.tokenization import Tokenizer

from . import machine_defaults
from .backends import create_backend
from .backends.openvino import resolve_precision
from .config import engine_threads
from .engine import EMBED, Work, prepare_inputs, run_batch
from .workers import MAIN_LANE_NICE, instance_cores, place_thread

log = logging.getLogger("bertzoo.serving")

# Raised when the engines' relative speeds change with our code (the package's version does not move between commits):
# ONNX Runtime's threads flushing denormals made it 1-8% faster, so choices measured before are measured again.
CACHE_FORMAT = 2
SECONDS_PER_CANDIDATE = 1.5
BATCH_SENTENCES = 32  # what a loaded server batches from 64 one-sentence clients on 2 instances
SAMPLE_SENTENCES = 96


@dataclass(frozen=True)
class Candidate:
    backend: str  # onnxruntime or openvino
    variant: str  # onnxruntime's encoder (fp32, optimized, int8); fp32 for openvino, which compiles that graph
    precision: str  # what the encoder computes in: fp32, int8 or bf16
    instances: int
    threads: int | None  # each instance's intra-op threads, as ServeConfig.engine_threads gives them

    def label(self) -> str:
        engine = self.variant if self.backend == "onnxruntime" else self.precision
        threads = self.threads or os.cpu_count() or 1
        return f"{self.backend} {engine}, {self.instances} x {threads} thread{'s' if threads > 1 else ''}"


@dataclass
class Row:
    """One line of the table a choice came from: a candidate's rate, or why it was not measured."""

    candidate: Candidate
    sentences_per_s: float | None = None
    note: str = ""

    def line(self, chosen: Candidate | None) -> str:
        rate = f"{self.sentences_per_s:,.1f} sentences/s" if self.sentences_per_s is not None else "not measured"
        mark = " <- chosen" if self.candidate == chosen else ""
        return f"{self.candidate.label()}: {rate}{f' ({self.note})' if self.note else ''}{mark}"


@dataclass
class Choice:
    chosen: Candidate
    rows: list[Row] = field(default_factory=list)
    source: str = ""  # how it was made: measured (in how long), from the cache, or the rule

    def table(self) -> tuple[str, ...]:
        return tuple(row.line(self.chosen) for row in self.rows)


def default_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "bertzoo" / "engine-choice"


def cache_key(model_dir: str | Path, threads: int | None, instances: int | None) -> dict:
    """What a cached choice holds for: this CPU, these cores, these engines, this artifact, these forced settings."""
    def version(package: str) -> str | None:
        try:
            return importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            return None

    manifest = Path(model_dir) / "manifest.json"
    return {"format": CACHE_FORMAT, "cpu": cpu_model(),
            "cpu_flags": hashlib.sha256(" ".join(sorted(cpu_flags())).encode()).hexdigest()[:16],
            "cores": machine_defaults.cores(),
            "versions": {p: version(p) for p in ("bertzoo", "onnxruntime", "openvino")},
            "artifact": hashlib.sha256(manifest.read_bytes()).hexdigest(),
            "forced": {"threads": threads, "instances": instances}}


def layouts(threads: int | None, instances: int | None) -> list[tuple[int, int | None]]:
    """(instances, threads per instance) to try, the core rule's first; a forced --instances is the only one."""
    if instances is not None:
        return [(instances, engine_threads(threads, instances))]
    rule = machine_defaults.instances("onnxruntime", "cpu", threads)
    found = [(rule, engine_threads(threads, rule))]
    if rule != 1:
        found.append((1, engine_threads(threads, 1)))
    return found


def ort_precision(variant: str) -> str:
    """What ONNX Runtime's ``variant`` encoder computes in."""
    return "int8" if variant == "int8" else "fp32"


def engines(model_dir: str | Path, manifest: dict) -> list[tuple[str, str, str, str]]:
    """(backend, variant, precision, why not eligible or "") of every engine this machine and artifact offer."""
    fp32_level = machine_defaults.fp32_level_variants(str(model_dir))
    found = [("onnxruntime", v, ort_precision(v),
              "" if v in fp32_level else "its export parity report misses fp32's task bounds")
             for v in ("fp32", "optimized", "int8") if v in manifest["graphs"]["encoder"]["files"]]
    if importlib.util.find_spec("openvino") is not None:
        found.append(("openvino", "fp32", "fp32", ""))
        found.append(("openvino", "fp32", "bf16", "" if native_bf16() else "this CPU has no native bf16"))
    return found


def openvino_gate(model_dir: str | Path, manifest: dict, precision: str, threads: int | None) -> str:
    """Why OpenVINO at ``precision`` is not at fp32-level agreement on this artifact, or "" where it is: its start-up
    gate (the server runs the same at every start, and stops on a miss), then the gate's task measures against fp32's
    task bounds, which bf16's own gate is looser than."""
    from .startup_gate import BackendParityError, check_backend

    tokenizer = Tokenizer.from_file(Path(model_dir) / manifest["tokenizer"])
    candidate = create_backend("openvino", model_dir, precision=precision, threads=threads, manifest=manifest)
    try:
        report = check_backend(candidate, "openvino", precision, model_dir, manifest, tokenizer,
                               Limits(**manifest["limits"]), threads)
    except BackendParityError as e:
        return str(e)
    return "; ".join(missed_bounds(BOUNDS["fp32"], {}, report["tasks"]))


def sample_batches(model_dir: str | Path, manifest: dict) -> list[dict]:
    """Padded encoder inputs of the bundled SST dev sentences, BATCH_SENTENCES a batch, as the server pads them."""
    tokenizer = Tokenizer.from_file(Path(model_dir) / manifest["tokenizer"])
    texts = [e.text for e in load_split(samples_dir(), "sentiment", "dev")][:SAMPLE_SENTENCES]
    encodings = encode_sentences(tokenizer, texts, Limits(**manifest["limits"]))
    batches = []
    for start in range(0, len(encodings), BATCH_SENTENCES):
        works = [Work(EMBED, (e,)) for e in encodings[start:start + BATCH_SENTENCES]]  # every artifact serves Embed
        batches.append((works, prepare_inputs(works, None, tokenizer.pad_id)))
    return batches


def measure(candidate: Candidate, model_dir: str | Path, manifest: dict, batches: list, seconds: float) -> float:
    """Sentences/s of ``candidate``'s instances running ``batches`` side by side for ``seconds``, each on a thread
    placed (cores, priority) as the server's main lane places it."""
    cores = instance_cores(candidate.instances, candidate.threads)
    done = [0] * candidate.instances
    backends: list = [None] * candidate.instances
    start = threading.Barrier(candidate.instances + 1)
    errors: list[BaseException] = []

    def run(k: int) -> None:
        try:
            place_thread(MAIN_LANE_NICE, cores[k])
            # Built here, as the server builds each engine on its worker: the threads it starts inherit the worker's
            # placement and ONNX Runtime's pool flushes denormals as the worker does.
            backends[k] = create_backend(candidate.backend, model_dir, variant=candidate.variant,
                                         precision=candidate.precision, threads=candidate.threads, manifest=manifest)
            run_batch(backends[k], *batches[0], "mean")  # warm: first-run allocations
        except BaseException as e:  # noqa: BLE001 (handed to the caller)
            errors.append(e)
        start.wait()
        deadline, i = time.perf_counter() + seconds, k
        while not errors and time.perf_counter() < deadline:
            works, inputs = batches[i % len(batches)]
            run_batch(backends[k], works, inputs, "mean")
            done[k] += len(works)
            i += 1

    workers = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(candidate.instances)]
    for worker in workers:
        worker.start()
    start.wait()
    began = time.perf_counter()
    for worker in workers:
        worker.join()
    if errors:
        raise errors[0]
    return sum(done) / (time.perf_counter() - began)


def measure_all(model_dir: str | Path, threads: int | None, instances: int | None,
                timer: Callable[[Candidate, list], float] | None = None,
                gate: Callable[[str], str] | None = None) -> Choice:
    """Time every eligible engine at the rule's layout, then the fastest at the other layouts; ``timer`` and
    ``gate`` (precision -> why not) replace the measurement and OpenVINO's gate (tests)."""
    started = time.perf_counter()
    manifest = load_manifest(model_dir, verify=False)  # its files' hashes: the server checks them when it loads
    batches = sample_batches(model_dir, manifest)
    timer = timer or (lambda c, b: measure(c, model_dir, manifest, b, SECONDS_PER_CANDIDATE))
    gate = gate or (lambda precision: openvino_gate(model_dir, manifest, precision, engine_threads(threads, 1)))
    first, *others = layouts(threads, instances)

    def timed(row: Row, gated: bool = True) -> Row:
        """``row`` with its rate, or with why it has none (its gate, or the error): an engine that cannot run here is
        a row, not a failed start. ``gated``: False for an engine whose gate passed at another layout."""
        try:
            if gated and row.candidate.backend == "openvino" and (failed := gate(row.candidate.precision)):
                row.note = f"not at fp32-level agreement: {failed}"
            else:
                row.sentences_per_s = timer(row.candidate, batches)
        except Exception as e:  # noqa: BLE001
            row.note = f"failed: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
        return row

    rows = [timed(Row(Candidate(backend, variant, precision, *first))) if not refusal
            else Row(Candidate(backend, variant, precision, *first), note=refusal)
            for backend, variant, precision, refusal in engines(model_dir, manifest)]
    measured = [r for r in rows if r.sentences_per_s is not None]
    if not measured:
        raise RuntimeError("no engine could be measured: " + "; ".join(r.line(None) for r in rows))
    best = max(measured, key=lambda r: r.sentences_per_s).candidate
    rows += [timed(Row(Candidate(best.backend, best.variant, best.precision, *layout)), gated=False)
             for layout in others]
    rows.sort(key=lambda r: -(r.sentences_per_s or -1.0))
    return Choice(rows[0].candidate, rows, f"measured in {time.perf_counter() - started:.1f} s")


def choose(model_dir: str | Path, threads: int | None = None, instances: int | None = None, retune: bool = False,
           cache_dir: Path | None = None, **measure_options) -> Choice:
    """The engine for ``--backend auto --variant auto`` on the CPU: from the cache where its key still holds (unless
    ``retune``), else measured and cached; the flag rules where the measurement fails."""
    artifact_path = hashlib.sha256(str(Path(model_dir).resolve()).encode()).hexdigest()[:16]
    cache = (cache_dir or default_cache_dir()) / f"{artifact_path}.json"
    key = cache_key(model_dir, threads, instances)
    if not retune:
        try:
            cached = json.loads(cache.read_text())
            if cached["key"] == key:
                rows = [Row(Candidate(**r["candidate"]), r["sentences_per_s"], r["note"]) for r in cached["rows"]]
                return Choice(Candidate(**cached["chosen"]), rows, f"cached in {cache} ({cached['source']})")
        except (OSError, ValueError, KeyError, TypeError):
            pass  # none yet, another machine's, or unreadable: measure
    try:
        choice = measure_all(model_dir, threads, instances, **measure_options)
    except Exception as e:  # noqa: BLE001 (the server still starts, on the rules)
        rule = rule_choice(model_dir, threads, instances)
        log.warning("measuring the engines failed (%s): serving %s by the flag rules", str(e).splitlines()[0] if str(e)
                    else type(e).__name__, rule.chosen.label())
        return rule
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(cache, json.dumps({"key": key, "chosen": asdict(choice.chosen), "source": choice.source,
                                             "rows": [{"candidate": asdict(r.candidate), "note": r.note,
                                                       "sentences_per_s": r.sentences_per_s} for r in choice.rows]},
                                            indent=1))
    except OSError as e:  # a read-only home: measured again at the next start
        log.warning("could not cache the engine choice in %s (%s)", cache, e)
    return choice


def rule_choice(model_dir: str | Path, threads: int | None, instances: int | None) -> Choice:
    """What the flag rules of machine_defaults pick, as a Choice with no table."""
    backend = machine_defaults.backend(str(model_dir), "cpu", variant_forced=False)
    variant = machine_defaults.variant(str(model_dir)) if backend == "onnxruntime" else "fp32"
    precision = ort_precision(variant) if backend == "onnxruntime" else resolve_precision("auto")
    n = instances or machine_defaults.instances(backend, "cpu", threads)
    return Choice(Candidate(backend, variant, precision, n, engine_threads(threads, n)), [], "the flag rules")

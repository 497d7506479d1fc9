"""The ``bertzoo`` command. Sub-commands import the trainer (and torch) only when they run."""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
from dataclasses import asdict
from pathlib import Path

import click

from .cli_parsing import parse_overrides
from .cli_pretrain import pretrain
from .cli_zoo import viz, zoo
from .errors import UserError
from .tasks import TASK_NAMES

# Libraries that log every pass at INFO or WARNING (the ONNX exporter and optimizer, ONNX Runtime's fusion and
# quantization tools, which log through the root logger, torch): shown with --verbose only.
THIRD_PARTY_LOGGERS = ("torch", "onnxscript", "onnx_ir", "onnxruntime", "fusion_base", "fusion_utils", "onnx_model",
                       "onnx_model_bert", "fusion_embedlayer", "fusion_attention", "fusion_skiplayernorm")


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S", stream=sys.stderr)
    logging.getLogger().setLevel(logging.DEBUG if verbose else logging.ERROR)  # every logger not named below
    logging.getLogger("bertzoo").setLevel(logging.DEBUG if verbose else logging.INFO)
    for name in THIRD_PARTY_LOGGERS:
        logging.getLogger(name).setLevel(logging.DEBUG if verbose else logging.ERROR)
    if not verbose:
        # torch sets its own loggers' levels when it is imported (later, and only by the commands that need it), from
        # TORCH_LOGS: "-onnx" keeps the exporter's warnings (e.g. "torchvision is not installed") at ERROR.
        os.environ.setdefault("TORCH_LOGS", "-onnx")


def _parse_tasks(value: str) -> tuple[str, ...]:
    tasks = tuple(t.strip() for t in value.split(",") if t.strip())
    bad = [t for t in tasks if t not in TASK_NAMES]
    if bad or not tasks:
        raise click.BadParameter(f"unknown task(s) {bad}; choose from {','.join(TASK_NAMES)}")
    return tasks


def _parse_settings(pairs: tuple[str, ...]) -> dict:
    from dataclasses import fields

    from bertzoo.trainer.config import TrainConfig

    known = {f.name for f in fields(TrainConfig)}
    settings = parse_overrides(pairs)
    unknown = sorted(set(settings) - known)
    if unknown:
        raise click.BadParameter(f"unknown training config key(s) {unknown}", param_hint="--set")
    return settings


# The install extra that brings each optional package (pyproject.toml): a command that needs one the installation
# lacks says which extra to install instead of showing an ImportError traceback.
EXTRA_FOR_MODULE = {"torch": "train", "matplotlib": "train", "onnxscript": "export", "onnx": "serve",
                    "onnxruntime": "serve"}
TORCH_CPU_HINT = " (on a machine without a GPU, install torch first from https://download.pytorch.org/whl/cpu)"


class _Commands(click.Group):
    """Every sub-command's user mistakes (bertzoo.errors.UserError) and missing extras end in one line, exit code 1."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except UserError as e:
            raise click.ClickException(str(e)) from e
        except ModuleNotFoundError as e:
            top = (e.name or "").split(".")[0]
            if top not in EXTRA_FOR_MODULE:
                raise
            command = ctx.invoked_subcommand or "this command"
            hint = TORCH_CPU_HINT if top == "torch" else ""
            raise click.ClickException(f"`bertzoo {command}` needs the {top} package, which this installation lacks: "
                                       f"pip install 'bertzoo[{EXTRA_FOR_MODULE[top]}]'{hint}") from e


# auto_envvar_prefix: every option of every command can also come from BERTZOO_<COMMAND>_<OPTION> (e.g.
# BERTZOO_TRAIN_MAX_STEPS); `serve` options keep their shorter BERTZOO_<OPTION> names, shown in --help.
@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"], "show_default": True,
                                              "auto_envvar_prefix": "BERTZOO"})
@click.version_option(package_name="bertzoo", prog_name="bertzoo")
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
def main(verbose: bool) -> None:
    """bertzoo: train, evaluate, export and serve small multitask BERT encoders."""
    _setup_logging(verbose)


@main.command()
@click.option("--preset", default=None, help="Start from a zoo preset (bertzoo zoo list) or a preset .toml file; "
              "the options below override it.")
@click.option("--set", "settings", multiple=True, metavar="KEY=VALUE",
              help="Any training config field (bertzoo zoo show baseline lists them), JSON value, e.g. "
                   "--set ssa_rounds=2 --set ag_patterns='[\"next\",\"first\"]'.")
@click.option("--data", "data_dir", type=click.Path(exists=True, file_okay=False), default=None,
              help="Data directory in the standard layout (see README). Default: the small bundled samples.")
@click.option("--out", "out_dir", default="runs/default", help="Run directory: checkpoints, logs, metrics.")
@click.option("--tasks", default=None, help=f"Comma-separated tasks to train [default: {','.join(TASK_NAMES)}].")
@click.option("--sentiment-dataset", type=click.Choice(["sst5", "cfimdb", "sst2"]), default=None)
@click.option("--backbone", default=None, help="'default' (all-MiniLM-L6-v2) or a HuggingFace BERT directory.")
@click.option("--random-init", is_flag=True, default=None, help="Build the encoder from the backbone config only.")
@click.option("--encoder", "encoder_overrides", multiple=True, metavar="KEY=VALUE",
              help="Encoder config override, e.g. attention=sparsegen_lin, sparsegen_lambda=-3, num_hidden_layers=2.")
@click.option("--pooling", type=click.Choice(["cls", "mean"]), default=None)
@click.option("--similarity-head", type=click.Choice(["cosine", "concat"]), default=None)
@click.option("--max-seq-length", type=int, default=None)
@click.option("--qa-max-length", type=int, default=None)
@click.option("--qa-doc-stride", type=int, default=None)
@click.option("--qa-unanswerable-fraction", type=float, default=None,
              help="Top SQuAD 2.0 train data up to this share of unanswerable questions with synthetic ones "
                   "[default: 0.5; 0: off].")
@click.option("--qa-null-threshold", type=float, default=None,
              help="Answer 'no answer' when the null score beats the best span by more than this [default: 0; "
                   "refitted at each checkpoint when articles are held out for it].")
@click.option("--qa-calibration-articles", type=int, default=None,
              help="SQuAD 2.0 articles held out of training to fit the no-answer threshold [default: 1; 0: off].")
@click.option("--epochs", type=float, default=None)
@click.option("--max-steps", type=int, default=None, help="Stop after this many steps (overrides --epochs).")
@click.option("--sst-phrases", type=click.Path(exists=True, dir_okay=False), default=None,
              help="An SST tree file (sst-trees/train.txt) whose labelled phrases join the sentiment training data.")
@click.option("--limit-per-task", type=int, default=None, help="Use only the first N training examples per task.")
@click.option("--eval-limit-per-task", type=int, default=None, help="Evaluate on the first N dev examples per task.")
@click.option("--batch-size", type=int, default=None)
@click.option("--batch-tokens", type=int, default=None,
              help="Length-grouped batches of up to this many padded tokens (never below --batch-size items).")
@click.option("--batch-tokens-tasks", default=None, callback=lambda _ctx, _param, v: _parse_tasks(v) if v else None,
              help="Comma-separated tasks that --batch-tokens applies to [default: all]; the others keep --batch-size.")
@click.option("--lr", type=float, default=None)
@click.option("--head-lr", type=float, default=None)
@click.option("--lr-layer-decay", type=float, default=None,
              help="Layer-wise lr decay: each encoder layer trains at this times the rate of the one above [1: off].")
@click.option("--weight-decay", type=float, default=None)
@click.option("--warmup-ratio", type=float, default=None)
@click.option("--grad-clip", type=float, default=None)
@click.option("--sampling", type=click.Choice(["round_robin", "proportional", "annealed", "dynamic"]), default=None,
              help="Task sampling; dynamic = task prioritization (paper 004), see the dtp_* settings.")
@click.option("--precision", type=click.Choice(["auto", "fp32", "bf16"]), default=None)
@click.option("--seed", type=int, default=None)
@click.option("--log-every", type=int, default=None)
@click.option("--keep-checkpoints", type=int, default=None)
@click.option("--save-every", type=int, default=None,
              help="Also checkpoint every N steps (no evaluation): a killed run loses at most N steps on --resume.")
@click.option("--save-every-minutes", type=float, default=None, help="Also checkpoint every this many minutes.")
@click.option("--no-eval", is_flag=True, help="Skip the per-epoch dev evaluation.")
@click.option("--no-progress", is_flag=True, help="No progress bar (logs only).")
@click.option("--resume", is_flag=True, help="Continue the run in --out from its last checkpoint and saved config.")
def train(preset: str | None, settings: tuple[str, ...], tasks: str | None, encoder_overrides: tuple[str, ...],
          random_init: bool | None, no_eval: bool, no_progress: bool, resume: bool, **options) -> None:
    """Fine-tune one multitask model (sentiment, paraphrase, similarity, QA) and evaluate it on dev."""
    from bertzoo.trainer.config import TrainConfig
    from bertzoo.trainer.evaluate import format_metrics
    from bertzoo.trainer.train import train as run_training
    from bertzoo.zoo import PresetError, load_preset

    given = {k: v for k, v in options.items() if v is not None}
    given.update(_parse_settings(settings))
    if tasks:
        given["tasks"] = _parse_tasks(tasks)
    if random_init:
        given["random_init"] = True
    if encoder_overrides:
        given["encoder_overrides"] = parse_overrides(encoder_overrides)
    given["eval_every_epoch"] = not no_eval
    given["progress"] = not no_progress
    saved = Path(given["out_dir"]) / "train_config.json"
    try:
        if resume and saved.is_file():
            # The saved config wins; only options given explicitly on this command line change it.
            ctx = click.get_current_context()
            param_of = {"eval_every_epoch": "no_eval", "progress": "no_progress"}
            explicit = {k: v for k, v in given.items()
                        if ctx.get_parameter_source(param_of.get(k, k)) == click.core.ParameterSource.COMMANDLINE}
            config = TrainConfig.from_dict({**json.loads(saved.read_text()), **explicit})
        elif preset:
            config = load_preset(preset).config(**given)
        else:
            config = TrainConfig(**given)
    except PresetError as e:
        raise click.BadParameter(str(e), param_hint="--preset") from e
    except json.JSONDecodeError as e:
        raise click.ClickException(f"{saved}: not valid JSON ({e}); start a new run without --resume") from e
    except (TypeError, ValueError) as e:
        raise click.UsageError(str(e)) from e
    _, metrics = run_training(config, resume=resume)
    if metrics:
        click.echo(format_metrics(metrics))
    _print_next_steps(config.out_dir)


def _print_next_steps(run: str) -> None:
    """Where the run is, which checkpoint its users get, and the commands that use it."""
    from bertzoo.trainer.checkpoint import resolve_checkpoint_pointer

    try:
        checkpoint, pointer = resolve_checkpoint_pointer(run)
    except FileNotFoundError:
        return  # nothing was saved (e.g. interrupted before the first checkpoint)
    artifact = f"artifacts/{Path(run).name}"
    click.echo(f"\nrun directory: {run}\ncheckpoint for predict, eval and export: {checkpoint} ({pointer or 'given'})"
               f"\nnext:\n  bertzoo predict {run} --task sentiment \"a gorgeous, witty film\"\n"
               f"  bertzoo export {run} --out {artifact} --int8\n  bertzoo serve {artifact}")


def _load(checkpoint: str):
    import torch

    from bertzoo.tokenization import Tokenizer
    from bertzoo.trainer.checkpoint import TOKENIZER, load_model
    from bertzoo.trainer.config import TrainConfig

    model, config, directory = load_model(checkpoint)
    # On a GPU machine eval and predict run there (fp32): 18 zoo evaluations on one H100 machine's CPU cores did not
    # finish in 7 minutes, where training all 18 had taken 6.
    if torch.cuda.is_available():
        model.cuda()
    train_config = TrainConfig.from_dict(config["train"])
    return model, Tokenizer.from_file(directory / TOKENIZER), train_config, directory


@main.command("eval")
@click.argument("checkpoint", type=click.Path(exists=True))
@click.option("--data", "data_dir", type=click.Path(exists=True, file_okay=False), default=None,
              help="Data directory (default: the bundled samples).")
@click.option("--split", default="dev")
@click.option("--tasks", default=None, help="Comma-separated subset of the model's tasks.")
@click.option("--limit", type=int, default=None, help="Evaluate on the first N examples per task.")
@click.option("--json-out", type=click.Path(dir_okay=False), default=None, help="Also write the metrics as JSON.")
@click.option("--qa-null-threshold", type=float, default=None, help="Override the checkpoint's no-answer threshold.")
def eval_command(checkpoint: str, data_dir: str | None, split: str, tasks: str | None, limit: int | None,
                 json_out: str | None, qa_null_threshold: float | None) -> None:
    """Print each task's official metric for CHECKPOINT (a checkpoint or run directory) on a split."""
    from bertzoo.trainer.evaluate import evaluate, format_metrics
    from bertzoo.trainer.training_data import load_splits

    model, tokenizer, config, directory = _load(checkpoint)
    config.data_dir = data_dir
    config.tasks = _parse_tasks(tasks) if tasks else config.tasks
    if qa_null_threshold is not None:
        model.config.qa_null_threshold = qa_null_threshold
    metrics = evaluate(model, load_splits(config, split, limit), tokenizer, config.limits, progress=True)
    click.echo(f"{directory} on {split}:")
    click.echo(format_metrics(metrics))
    if json_out:
        Path(json_out).write_text(json.dumps(metrics, indent=2))


@main.command()
@click.argument("checkpoint", type=click.Path(exists=True))
@click.option("--task", type=click.Choice(TASK_NAMES), required=True)
@click.option("--json", "as_json", is_flag=True,
              help="Print {\"results\": [...]} with the field names of the RPC's answer (as `bertzoo client` does).")
@click.argument("texts", nargs=-1, required=True)
def predict(checkpoint: str, task: str, as_json: bool, texts: tuple[str, ...]) -> None:
    """Answer from CHECKPOINT. sentiment: TEXT...; paraphrase/similarity: TEXT_A TEXT_B; qa: QUESTION CONTEXT."""
    from bertzoo import tasks as T
    from bertzoo.data import PairExample, QAExample, SentenceExample
    from bertzoo.trainer.checkpoint import resolve_checkpoint_pointer
    from bertzoo.trainer.evaluate import predict_outputs

    model, tokenizer, config, directory = _load(checkpoint)
    if task == "sentiment":
        examples = [SentenceExample(str(i), t, None) for i, t in enumerate(texts)]
    elif len(texts) != 2:
        raise click.UsageError(f"--task {task} takes exactly two texts, got {len(texts)}")
    elif task == "qa":
        examples = [QAExample("0", texts[0], texts[1], (), (), False)]
    else:
        examples = [PairExample("0", texts[0], texts[1], None)]
    _, pointer = resolve_checkpoint_pointer(checkpoint)
    click.echo(f"using {directory}" + (f" (the run's {pointer} checkpoint)" if pointer else ""), err=True)
    outputs = predict_outputs(model, task, examples, tokenizer, config.limits)
    results = T.answers(task, outputs, T.task_spec("sentiment", config.sentiment_dataset).labels)
    if as_json:
        click.echo(json.dumps({"results": [asdict(r) for r in results]}, indent=2, ensure_ascii=False))
        return
    for example, r in zip(examples, results, strict=True):
        if task == "sentiment":
            click.echo(f"{r.label} (p={max(r.probabilities):.2f})\t{example.text}")
        elif task == "paraphrase":
            click.echo(f"{'paraphrase' if r.is_paraphrase else 'not a paraphrase'} (p={r.probability:.2f})")
        elif task == "similarity":
            click.echo(f"similarity {r.score:.2f} / 5")
        else:
            click.echo("no answer" if r.no_answer else f"{r.answer!r} (characters {r.start_char}-{r.end_char})")


@main.command("export")
@click.argument("checkpoint", type=click.Path(exists=True))
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Artifact directory to write.")
@click.option("--optimize", is_flag=True, help="Add an encoder with ONNX Runtime's transformer fusions.")
@click.option("--int8", is_flag=True, help="Add a dynamically int8-quantized encoder.")
@click.option("--per-channel/--per-tensor", default=True, help="int8 weight scales per output channel or per tensor.")
@click.option("--trt", is_flag=True, help="Add a TensorRT fp16 engine (needs tensorrt and an NVIDIA GPU).")
@click.option("--triton", is_flag=True, help="Add a Triton Inference Server model repository (triton/).")
@click.option("--sign-key", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Sign the manifest with this Ed25519 private key (PEM); `serve --verify-key` checks it.")
@click.option("--hf", is_flag=True, help="Add a Hugging Face model directory (hf/) that transformers and "
              "sentence-transformers load, with the task heads beside it.")
@click.option("--data", "data_dir", type=click.Path(exists=True, file_okay=False), default=None,
              help="Dev data for the task-level parity gates (default: the bundled samples).")
@click.option("--parity-limit", type=int, default=200, help="Dev examples per task for the parity gates.")
@click.option("--force", is_flag=True, help="Replace OUT if it exists.")
def export_command(checkpoint: str, out_dir: str, **options) -> None:
    """Export CHECKPOINT to an artifact directory the server loads without torch (ONNX, manifest, parity report)."""
    from bertzoo.export.exporter import ExportError, ExportOptions, export_checkpoint
    from bertzoo.export.tensorrt import TensorRTUnavailable

    try:
        manifest = export_checkpoint(checkpoint, out_dir, ExportOptions(**options, progress=True))
    except (ExportError, TensorRTUnavailable) as e:
        raise click.ClickException(str(e)) from e
    for variant, report in manifest["parity"].items():
        shown = ", ".join(f"{t}: " + ", ".join(f"{k}={v:.4g}" for k, v in r.items() if k != "n")
                          for t, r in report["tasks"].items())
        click.echo(f"{variant:10s} encoder max abs diff {report['tensor_max_abs']['encoder']:.2e}; {shown}")
    click.echo(f"wrote {out_dir} ({len(manifest['files'])} files, manifest.json)")



# ---------------------------------------------------------------- serving

SERVE_TASKS = ("sentiment", "paraphrase", "similarity", "qa", "embed")


def _serve_option(*decls: str, name: str, **kwargs):
    """A `serve` option whose default is ServeConfig's (or BatchSettings') and which BERTZOO_<NAME> also sets."""
    from bertzoo.serving.config import BatchSettings, ServeConfig

    fields = {**BatchSettings.__dataclass_fields__, **ServeConfig.__dataclass_fields__}
    if "default" not in kwargs and name in fields:
        kwargs["default"] = fields[name].default
    return click.option(*decls, name, envvar=f"BERTZOO_{name.upper()}", show_envvar=True, **kwargs)


@main.command()
@click.argument("model_dir", type=click.Path(exists=True, file_okay=False), envvar="BERTZOO_MODEL_DIR")
@_serve_option("--backend", name="backend", type=click.Choice(["onnxruntime", "torch", "tensorrt", "openvino"]),
               help="onnxruntime: MODEL_DIR is a `bertzoo export` artifact; openvino: the same artifact on OpenVINO "
                    "(CPU; pip install 'bertzoo[openvino]'); tensorrt: an artifact exported with --trt (needs --device "
                    "cuda); torch: a checkpoint or run directory (the PyTorch reference backend).")
@_serve_option("--device", name="device", type=click.Choice(["cpu", "cuda"]),
               help="cuda: the first visible NVIDIA GPU (onnxruntime needs the onnxruntime-gpu package).")
@_serve_option("--precision", name="precision", type=click.Choice(["auto", "fp32", "fp16", "bf16"]),
               help="torch: what the encoder computes in, auto = fp16 on cuda, fp32 on cpu; openvino: fp32 or bf16, "
                    "auto = bf16 where the CPU has native bf16 (AVX-512 BF16, AMX), else fp32.")
@_serve_option("--openvino-cache-dir", name="openvino_cache_dir", type=click.Path(file_okay=False),
               help="openvino: where compiled models are cached, so a restart does not compile again "
                    "[default: ~/.cache/bertzoo/openvino].")
@_serve_option("--cuda-graphs/--no-cuda-graphs", name="cuda_graphs",
               help="torch backend on cuda: replay the encoder as one captured CUDA graph per batch shape.")
@_serve_option("--variant", name="variant", type=click.Choice(["fp32", "optimized", "int8"]),
               help="The artifact's encoder variant (onnxruntime).")
@_serve_option("--threads", name="threads", type=int, help="Backend intra-op threads [default: all cores].")
@_serve_option("--ort-spinning/--no-ort-spinning", name="ort_spinning",
               help="ONNX Runtime threads spin between ops: lower latency, busier idle CPU.")
@_serve_option("--host", name="host", help="Address the gRPC port binds to.")
@_serve_option("--port", name="port", type=int, help="gRPC port.")
@_serve_option("--metrics-host", name="metrics_host", help="Address of the metrics endpoint (local by default).")
@_serve_option("--metrics-port", name="metrics_port", type=int, help="Prometheus /metrics port; 0: none.")
@_serve_option("--max-items", name="max_items", type=int, help="Items per request.")
@_serve_option("--max-text-chars", name="max_text_chars", type=int,
               help="Characters per text, QA contexts included; longer texts are rejected.")
@_serve_option("--max-message-bytes", name="max_message_bytes", type=int,
               help="Bytes per request message; larger ones are answered RESOURCE_EXHAUSTED and counted [default: "
                    "room for --max-items pairs of --max-text-chars 4-byte characters].")
@_serve_option("--max-request-tokens", name="max_request_tokens", type=int,
               help="Encoder tokens per request (every sentence and QA window); costlier requests are refused with "
                    "INVALID_ARGUMENT.")
@_serve_option("--instances", name="instances", type=int,
               help="Engine instances running batches side by side (CPU engines), the --threads shared out among "
                    "them; 2 on a small machine lets two batches run while the other waits for nothing.")
@_serve_option("--long-request-tokens", name="long_request_tokens", type=int,
               help="Requests costing more encoder tokens than this run in the long-request lane, at low CPU "
                    "priority, so short requests are not held behind them.")
@_serve_option("--overlong", name="overlong", type=click.Choice(["truncate", "reject"]),
               help="A sentence over the model's max_seq_length tokens (or a question over qa_max_question_tokens): "
                    "truncate it as training did, or reject the request with INVALID_ARGUMENT.")
@_serve_option("--max-batch-size", name="max_batch_size", type=int, help="Sequences per encoder batch.")
@_serve_option("--max-batch-tokens", name="max_batch_tokens", type=int,
               help="Padded tokens (sequences x length bucket) per encoder batch.")
@_serve_option("--max-queue", name="max_queue", type=int,
               help="Requests waiting for the model; more are answered RESOURCE_EXHAUSTED.")
@_serve_option("--max-queue-delay-ms", name="max_queue_delay_ms", type=float,
               help="How long an idle model waits to fill a batch; 0: never.")
@_serve_option("--pad-to", name="pad_to", type=click.Choice(["longest", "bucket"]), default=None,
               help="Pad a batch to its longest sequence (least compute on CPU) or to its length bucket (fixed shapes) "
                    "[default: bucket on a GPU, where engines and CUDA graphs want few shapes; longest on the CPU].")
@_serve_option("--tls-cert", name="tls_cert", type=click.Path(exists=True, dir_okay=False),
               help="PEM certificate (chain); with --tls-key the server speaks TLS only.")
@_serve_option("--tls-key", name="tls_key", type=click.Path(exists=True, dir_okay=False), help="PEM private key.")
@_serve_option("--verify-key", name="verify_key", type=click.Path(exists=True, dir_okay=False),
               help="Ed25519 public key (PEM): serve only an artifact whose manifest it signed (export --sign-key).")
@_serve_option("--tls-client-ca", name="tls_client_ca", type=click.Path(exists=True, dir_okay=False),
               help="PEM CA bundle: require a client certificate it signed (mTLS).")
@_serve_option("--auth-token", name="auth_token",
               help="Require 'authorization: Bearer <token>' on every call but health checks. Prefer the environment "
                    "variable or --auth-token-file: a command line is visible to other users.")
@click.option("--auth-token-file", type=click.Path(exists=True, dir_okay=False), envvar="BERTZOO_AUTH_TOKEN_FILE",
              show_envvar=True, help="Read the token from this file.")
@_serve_option("--shutdown-grace", name="shutdown_grace", type=float,
               help="Seconds accepted requests get to finish after SIGTERM.")
@_serve_option("--tokenize-threads", name="tokenize_threads", type=int, help="Tokenizer threads.")
@_serve_option("--warmup/--no-warmup", name="warmup", help="Run every length bucket once before reporting SERVING.")
def serve(auth_token_file: str | None, max_batch_size: int, max_batch_tokens: int, max_queue: int,
          max_queue_delay_ms: float, pad_to: str, **options) -> None:
    """Serve MODEL_DIR over gRPC (bertzoo.v1.Bertzoo, health, reflection) until SIGTERM, with a dynamic batcher and
    Prometheus metrics. Every option can also be set by the environment variable shown."""
    import asyncio

    from bertzoo.artifact import ArtifactError
    from bertzoo.serving.backends import BackendUnavailable, check_available, check_model_dir
    from bertzoo.serving.config import BatchSettings, ServeConfig
    from bertzoo.serving.grpc_server import serve as run_server

    if auth_token_file:
        options["auth_token"] = Path(auth_token_file).read_text().strip()
    if pad_to is None:
        pad_to = "bucket" if options["device"] == "cuda" else "longest"
    try:
        batch = BatchSettings(max_batch_size, max_batch_tokens, max_queue, max_queue_delay_ms, pad_to)
        config = ServeConfig(batch=batch, **options)
    except ValueError as e:
        raise click.UsageError(str(e)) from e
    try:
        # Before the port is bound: one line naming what to install, or what MODEL_DIR should be.
        check_available(config.backend, config.device)
        check_model_dir(config.backend, config.model_dir, config.verify_key)
        asyncio.run(run_server(config))
    except (ArtifactError, BackendUnavailable, FileNotFoundError, OSError) as e:
        raise click.ClickException(str(e)) from e


def _client_options(command):
    """The connection options of the commands that call a server, handed to the command as one ``connection`` dict
    of BertzooClient's keyword arguments (and ``timeout``)."""

    @functools.wraps(command)
    def with_connection(*args, target: str, token: str | None, tls: bool, tls_ca: str | None,
                        tls_client_cert: str | None, tls_client_key: str | None, **kwargs):
        if (tls_client_cert is None) != (tls_client_key is None):
            raise click.UsageError("--tls-client-cert and --tls-client-key go together")
        connection = {"target": target, "token": token, "tls": tls or tls_client_cert is not None,
                      "root_certificates": tls_ca, "certificate_chain": tls_client_cert, "private_key": tls_client_key}
        return command(*args, connection=connection, **kwargs)

    pem = click.Path(exists=True, dir_okay=False)
    for decorator in (
        click.option("--target", default="localhost:50051", envvar="BERTZOO_TARGET", show_envvar=True,
                     help="Server address, host:port."),
        click.option("--token", envvar="BERTZOO_AUTH_TOKEN", show_envvar=True,
                     help="Bearer token, if the server wants one."),
        click.option("--tls", is_flag=True, help="Connect with TLS (system root certificates)."),
        click.option("--tls-ca", type=pem, help="Connect with TLS, trusting this PEM certificate (implies --tls)."),
        click.option("--tls-client-cert", type=pem, envvar="BERTZOO_TLS_CLIENT_CERT", show_envvar=True,
                     help="PEM client certificate, for servers that require one (mTLS; implies --tls)."),
        click.option("--tls-client-key", type=pem, envvar="BERTZOO_TLS_CLIENT_KEY", show_envvar=True,
                     help="PEM private key of --tls-client-cert."),
        click.option("--timeout", type=float, default=30.0, help="Deadline per call, seconds."),
    ):
        with_connection = decorator(with_connection)
    return with_connection


@main.command("client")
@click.argument("task", type=click.Choice([*SERVE_TASKS, "info", "health"]))
@click.argument("texts", nargs=-1)
@_client_options
@click.option("--service", default="", help="health: the service to check (bertzoo.v1.Bertzoo); '' is the server.")
@click.option("--wait", type=float, default=0.0,
              help="health: check again until SERVING or this many seconds have passed (0: check once).")
def client_command(task: str, texts: tuple[str, ...], connection: dict, timeout: float, service: str,
                   wait: float) -> None:
    """Call a bertzoo server and print the answer as JSON. sentiment / embed: TEXT...; paraphrase / similarity:
    TEXT_A TEXT_B [TEXT_A TEXT_B ...]; qa: QUESTION CONTEXT; info; health.

    health is a probe for scripts, containers and orchestrators: exit code 0 only when SERVING; 2 when the server
    cannot be reached (or the deadline passed); 3 when the health RPC failed; 4 for any other status (NOT_SERVING while
    loading or draining, SERVICE_UNKNOWN); 5 for a TLS or authorization failure. The reason goes to stderr."""
    import grpc
    from google.protobuf.json_format import MessageToDict

    from bertzoo.serving.client import HEALTH_SERVING, BertzooClient, wait_for_health

    if task == "health":
        if wait < 0:
            raise click.UsageError("--wait must be >= 0")
        with BertzooClient(**connection, timeout=timeout) as client:
            code, what = wait_for_health(client, service, wait=wait, timeout=min(timeout, 5.0) if wait else timeout)
        if code == HEALTH_SERVING:
            click.echo(json.dumps({"status": what}))
        else:
            click.echo(f"{connection['target']}: {what}", err=True)
        sys.exit(code)

    pairs = list(zip(texts[::2], texts[1::2], strict=False))
    if task in ("sentiment", "embed") and not texts:
        raise click.UsageError(f"{task} needs at least one TEXT")
    if task in ("paraphrase", "similarity") and (not texts or len(texts) % 2):
        raise click.UsageError(f"{task} takes TEXT_A TEXT_B pairs, got {len(texts)} texts")
    if task == "qa" and len(texts) != 2:
        raise click.UsageError(f"qa takes QUESTION CONTEXT, got {len(texts)} texts")
    with BertzooClient(**connection, timeout=timeout) as client:
        try:
            calls = {"sentiment": lambda: client.sentiment(texts), "embed": lambda: client.embed(texts),
                     "paraphrase": lambda: client.paraphrase(pairs), "similarity": lambda: client.similarity(pairs),
                     "qa": lambda: client.qa(pairs), "info": client.model_info}
            response = calls[task]()
        except grpc.RpcError as e:
            raise click.ClickException(f"{e.code().name}: {e.details()}") from e
    shown = MessageToDict(response, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    click.echo(json.dumps(shown, indent=2, ensure_ascii=False))


@main.command("bench-serve")
@click.option("--task", type=click.Choice(SERVE_TASKS), default="sentiment")
@click.option("--data", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Inputs: an SST dev file (ids-sst-dev.csv, or GLUE .tsv) for sentiment / embed, quora / sts .csv "
                   "for the pair tasks, SQuAD .json for qa [default: the bundled dev sample].")
@click.option("--concurrency", type=int, default=8, help="Concurrent clients, each with its own connection.")
@click.option("--duration", type=float, default=10.0, help="Seconds to run (unless --requests).")
@click.option("--requests", "request_count", type=int, default=None, help="Send this many requests, then stop.")
@click.option("--items", type=int, default=1, help="Items per request.")
@click.option("--json-out", type=click.Path(dir_okay=False), default=None, help="Also write the summary as JSON.")
@_client_options
def bench_serve(task: str, data: str | None, concurrency: int, duration: float, request_count: int | None, items: int,
                json_out: str | None, connection: dict, timeout: float) -> None:
    """Load-test a running server: N concurrent clients with real sentences; throughput, p50/p95/p99, errors."""
    import asyncio

    from bertzoo.serving.client import BertzooClient
    from bertzoo.serving.load import format_report, load_items, run_load

    if concurrency < 1 or items < 1:
        raise click.UsageError("--concurrency and --items must be >= 1")
    inputs = load_items(task, data)
    with BertzooClient(**connection) as client:
        try:
            client.wait_ready(timeout=timeout)
        except TimeoutError as e:
            raise click.ClickException(str(e)) from e
    report = asyncio.run(run_load(connection, task, inputs, concurrency=concurrency,
                                  duration=None if request_count else duration, requests=request_count,
                                  items_per_request=items, timeout=timeout, progress=True))
    summary = report.summary()
    click.echo(format_report(summary))
    if json_out:
        Path(json_out).write_text(json.dumps(summary, indent=2))


# The zoo's commands live in their own modules, which know nothing of ``main``.
for command in (zoo, viz, pretrain):
    main.add_command(command)

if __name__ == "__main__":
    main()

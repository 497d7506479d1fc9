"""The ``bertzoo`` command. Sub-commands import the trainer (and torch) only when they run."""

from __future__ import annotations

import json
import logging
import os
import sys
from dataclasses import asdict
from pathlib import Path

import click

from . import allocator
from .cli_next import print_next_steps
from .cli_parsing import parse_overrides
from .cli_pretrain import pretrain
from .cli_serve import bench_serve, client_command, serve
from .cli_zoo import viz, zoo
from .errors import UserError
from .tasks import TASK_NAMES

# Libraries that log every pass at INFO or WARNING (the ONNX exporter and optimizer, ONNX Runtime's fusion and
# quantization tools, which log through the root logger, torch): shown with --verbose only.
# Where `bertzoo train` writes a run given no --out (TrainConfig.out_dir's default too).
DEFAULT_RUN_DIR = "runs/default"
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
@click.option("--out", "out_dir", default=None,
              help=f"Run directory: checkpoints, logs, metrics [default: {DEFAULT_RUN_DIR}; where it holds a run, "
                   f"the first of {DEFAULT_RUN_DIR}-2, -3, ... that holds none; --resume and --force act on "
                   f"{DEFAULT_RUN_DIR}].")
@click.option("--tasks", default=None, help=f"Comma-separated tasks to train [default: {','.join(TASK_NAMES)}].")
@click.option("--sentiment-dataset", type=click.Choice(["sst5", "cfimdb", "sst2"]), default=None,
              help="Sentiment data: SST-5 (5 labels), CFIMDB or GLUE SST-2 (2 labels each) [default: sst5].")
@click.option("--backbone", default=None, help="'default' (all-MiniLM-L6-v2) or a HuggingFace BERT directory.")
@click.option("--random-init", is_flag=True, default=None, help="Build the encoder from the backbone config only.")
@click.option("--encoder", "encoder_overrides", multiple=True, metavar="KEY=VALUE",
              help="Encoder config override, e.g. attention=sparsegen_lin, sparsegen_lambda=-3, num_hidden_layers=2.")
@click.option("--pooling", type=click.Choice(["cls", "mean"]), default=None,
              help="A sentence's vector: the mean of its real tokens' states, or the [CLS] state [default: mean].")
@click.option("--similarity-head", type=click.Choice(["cosine", "concat"]), default=None,
              help="cosine: 5 x the cosine of the two vectors; concat: a regressor on [u; v; |u - v|] (the zoo's "
                   "heads: --set similarity_head=...) [default: cosine].")
@click.option("--max-seq-length", type=int, default=None,
              help="Tokens per sentence; longer sentences are cut [default: 128].")
@click.option("--qa-max-length", type=int, default=None,
              help="Tokens per QA window: the question and a piece of the context [default: 384].")
@click.option("--qa-doc-stride", type=int, default=None,
              help="Context tokens shared by consecutive windows of a long context [default: 128].")
@click.option("--qa-unanswerable-fraction", type=float, default=None,
              help="Top SQuAD 2.0 train data up to this share of unanswerable questions with synthetic ones "
                   "[default: 0.5; 0: off].")
@click.option("--qa-null-threshold", type=float, default=None,
              help="Answer 'no answer' when the null score beats the best span by more than this [default: 0; "
                   "refitted at each checkpoint when articles are held out for it].")
@click.option("--qa-calibration-articles", type=int, default=None,
              help="SQuAD 2.0 articles held out of training to fit the no-answer threshold [default: 1; 0: off].")
@click.option("--epochs", type=float, default=None,
              help="Passes over every task's training data, fractions allowed [default: 1].")
@click.option("--max-steps", type=int, default=None, help="Stop after this many steps (overrides --epochs).")
@click.option("--sst-phrases", type=click.Path(exists=True, dir_okay=False), default=None,
              help="An SST tree file (sst-trees/train.txt) whose labelled phrases join the sentiment training data.")
@click.option("--limit-per-task", type=int, default=None, help="Use only the first N training examples per task.")
@click.option("--eval-limit-per-task", type=int, default=None, help="Evaluate on the first N dev examples per task.")
@click.option("--batch-size", type=int, default=None,
              help="Items per step and process; a pair task's item is two sentences [default: 16].")
@click.option("--batch-tokens", type=int, default=None,
              help="Length-grouped batches of up to this many padded tokens (never below --batch-size items).")
@click.option("--batch-tokens-tasks", default=None, callback=lambda _ctx, _param, v: _parse_tasks(v) if v else None,
              help="Comma-separated tasks that --batch-tokens applies to [default: all]; the others keep --batch-size.")
@click.option("--lr", type=float, default=None,
              help="The encoder's peak learning rate (AdamW, linear warmup then linear decay) [default: 5e-05].")
@click.option("--head-lr", type=float, default=None, help="The task heads' peak learning rate [default: 0.001].")
@click.option("--lr-layer-decay", type=float, default=None,
              help="Layer-wise lr decay: each encoder layer trains at this times the rate of the one above [1: off].")
@click.option("--weight-decay", type=float, default=None,
              help="AdamW weight decay, not on biases and LayerNorm weights [default: 0.01].")
@click.option("--warmup-ratio", type=float, default=None,
              help="Share of the steps over which the learning rate rises from 0 [default: 0.1].")
@click.option("--grad-clip", type=float, default=None,
              help="Clip the gradients' global norm to this [default: 1.0].")
@click.option("--sampling", type=click.Choice(["round_robin", "proportional", "annealed", "dynamic"]), default=None,
              help="Task sampling; dynamic = task prioritization (paper 004), see the dtp_* settings.")
@click.option("--precision", type=click.Choice(["auto", "fp32", "bf16"]), default=None,
              help="auto: bf16 autocast on a GPU that supports it, fp32 on a CPU; bf16 is faster on a CPU with native "
                   "bf16 (avx512_bf16, AMX) [default: auto].")
@click.option("--seed", type=int, default=None,
              help="Random seed: a run is reproducible from it, resumed or not [default: 0].")
@click.option("--log-every", type=int, default=None, help="A train_log.jsonl record every N steps [default: 10].")
@click.option("--keep-checkpoints", type=int, default=None,
              help="Keep the N newest checkpoints, and BEST [default: 2].")
@click.option("--save-every", type=int, default=None,
              help="Also checkpoint every N steps (no evaluation): a killed run loses at most N steps on --resume.")
@click.option("--save-every-minutes", type=float, default=None, help="Also checkpoint every this many minutes.")
@click.option("--no-eval", is_flag=True, help="Skip the per-epoch dev evaluation.")
@click.option("--no-progress", is_flag=True, help="No progress bar (logs only).")
@click.option("--resume", is_flag=True, help="Continue the run in --out from its last checkpoint and saved config.")
@click.option("--force", is_flag=True, help="Replace the run in --out, if it holds one (its checkpoints and log are "
              "deleted); without --force or --resume, train refuses a directory that holds a run.")
@click.option("--allocator", "allocator_choice", type=click.Choice(allocator.CHOICES), default="auto", show_default=True,
              help="Memory allocator: tcmalloc (less memory and faster with packed batches; restarts the process "
                   "with it preloaded), auto = tcmalloc where installed, or the C library's (system).")
def train(preset: str | None, settings: tuple[str, ...], tasks: str | None, encoder_overrides: tuple[str, ...],
          random_init: bool | None, no_eval: bool, no_progress: bool, resume: bool, force: bool,
          allocator_choice: str, **options) -> None:
    """Fine-tune one multitask model (sentiment, paraphrase, similarity, QA) and evaluate it on dev."""
    try:
        library = allocator.library_to_preload(allocator_choice, dict(os.environ))
    except allocator.AllocatorError as e:
        raise click.UsageError(str(e)) from e
    if library is not None and allocator.started_as_bertzoo(sys.argv):
        allocator.restart_with(library, ["-m", "bertzoo", *sys.argv[1:]])  # before torch is imported; no return
    from bertzoo.trainer.checkpoint import claim_run_dir
    from bertzoo.trainer.config import TrainConfig
    from bertzoo.trainer.evaluate import format_metrics
    from bertzoo.trainer.train import train as run_training
    from bertzoo.trainer.training_data import check_data_files
    from bertzoo.zoo import PresetError, load_preset

    given = {k: v for k, v in options.items() if v is not None}
    given.update(_parse_settings(settings))
    if "out_dir" not in given:
        given["out_dir"] = str(_default_run_dir(resume or force))
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
    # Once every option is known good and the data is there, before anything is written: a repeated command must not
    # take over a finished run, and --force deletes the old one only when the new one can start. Under torchrun only
    # rank 0 deletes.
    check_data_files(config)
    claim_run_dir(Path(config.out_dir), resume, force, remove=os.environ.get("RANK", "0") == "0")
    _, metrics = run_training(config, resume=resume)
    if metrics:
        click.echo(format_metrics(metrics))
    print_next_steps(config.out_dir, config.tasks[0])


def _default_run_dir(continue_or_replace: bool) -> Path:
    """Where a run given no --out goes: a repeated `bertzoo train` trains a new run beside the old one instead of
    refusing, and says where. --resume and --force act on DEFAULT_RUN_DIR itself; so does a torchrun launch, whose
    ranks would otherwise race to pick a directory."""
    from bertzoo.trainer.checkpoint import first_free_run_dir

    base = Path(DEFAULT_RUN_DIR)
    if continue_or_replace or int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return base
    chosen = first_free_run_dir(base)
    if chosen != base:
        click.echo(f"{base} holds a run: this one goes to {chosen} (--out to choose the directory, --resume to "
                   f"continue {base}, --force to replace it)", err=True)
    return chosen


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
@click.option("--split", type=click.Choice(["dev", "train"]), default="dev", help="Which files of --data to score.")
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
@click.option("--task", type=click.Choice(TASK_NAMES), required=True, help="The trained task that answers.")
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


# These commands live in their own modules, which know nothing of ``main``.
for command in (zoo, viz, pretrain, serve, client_command, bench_serve):
    main.add_command(command)

# `bertzoo --help`'s one-line summaries, whole: click would otherwise cut each docstring's first sentence at the
# terminal's width (about 60 characters), mid-sentence.
SUMMARIES = {
    "train": "Fine-tune a multitask model and evaluate it on dev.",
    "eval": "Score a checkpoint on a split: each task's official metric.",
    "predict": "Answer texts with a checkpoint, for one task.",
    "export": "Export a checkpoint to an artifact that serve loads.",
    "serve": "Serve an artifact (or a checkpoint) over gRPC.",
    "client": "Call a running server; print the answer as JSON.",
    "bench-serve": "Load-test a running server: throughput and latency.",
    "pretrain": "Masked-language-model pre-training of a backbone.",
    "viz": "Draw a checkpoint's attention on a text as heatmaps.",
    "zoo": "The attention-variant zoo's presets.",
}
for name, summary in SUMMARIES.items():
    main.commands[name].short_help = summary

if __name__ == "__main__":
    main()

"""The ``bertzoo`` command. Sub-commands import the trainer (and torch) only when they run."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import click

from .tasks import TASK_NAMES


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format="%(asctime)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S", stream=sys.stderr)


def _parse_tasks(value: str) -> tuple[str, ...]:
    tasks = tuple(t.strip() for t in value.split(",") if t.strip())
    bad = [t for t in tasks if t not in TASK_NAMES]
    if bad or not tasks:
        raise click.BadParameter(f"unknown task(s) {bad}; choose from {','.join(TASK_NAMES)}")
    return tasks


def _parse_overrides(pairs: tuple[str, ...]) -> dict:
    overrides = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep:
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="--encoder")
        try:
            overrides[key] = json.loads(raw)
        except json.JSONDecodeError:
            overrides[key] = raw  # a bare string such as attention=sparsegen_lin
    return overrides


@click.group(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
def main(verbose: bool) -> None:
    """bertzoo: train, evaluate, export and serve small multitask BERT encoders."""
    _setup_logging(verbose)


@main.command()
@click.option("--data", "data_dir", type=click.Path(file_okay=False), default=None,
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
                   "[default: 1/3; 0: off].")
@click.option("--qa-null-threshold", type=float, default=None,
              help="Answer 'no answer' when the null score beats the best span by more than this [default: 0].")
@click.option("--epochs", type=float, default=None)
@click.option("--max-steps", type=int, default=None, help="Stop after this many steps (overrides --epochs).")
@click.option("--limit-per-task", type=int, default=None, help="Use only the first N training examples per task.")
@click.option("--eval-limit-per-task", type=int, default=None, help="Evaluate on the first N dev examples per task.")
@click.option("--batch-size", type=int, default=None)
@click.option("--lr", type=float, default=None)
@click.option("--head-lr", type=float, default=None)
@click.option("--weight-decay", type=float, default=None)
@click.option("--warmup-ratio", type=float, default=None)
@click.option("--grad-clip", type=float, default=None)
@click.option("--sampling", type=click.Choice(["round_robin", "proportional", "annealed"]), default=None)
@click.option("--precision", type=click.Choice(["auto", "fp32", "bf16"]), default=None)
@click.option("--seed", type=int, default=None)
@click.option("--log-every", type=int, default=None)
@click.option("--keep-checkpoints", type=int, default=None)
@click.option("--no-eval", is_flag=True, help="Skip the per-epoch dev evaluation.")
@click.option("--no-progress", is_flag=True, help="No progress bar (logs only).")
@click.option("--resume", is_flag=True, help="Continue the run in --out from its last checkpoint and saved config.")
def train(tasks: str | None, encoder_overrides: tuple[str, ...], random_init: bool | None, no_eval: bool, no_progress: bool,
          resume: bool, **options) -> None:
    """Fine-tune one multitask model (sentiment, paraphrase, similarity, QA) and evaluate it on dev."""
    from bertzoo.trainer.config import TrainConfig
    from bertzoo.trainer.evaluate import format_metrics
    from bertzoo.trainer.train import train as run_training

    given = {k: v for k, v in options.items() if v is not None}
    if tasks:
        given["tasks"] = _parse_tasks(tasks)
    if random_init:
        given["random_init"] = True
    if encoder_overrides:
        given["encoder_overrides"] = _parse_overrides(encoder_overrides)
    given["eval_every_epoch"] = not no_eval
    given["progress"] = not no_progress
    saved = Path(given["out_dir"]) / "train_config.json"
    if resume and saved.is_file():
        # The saved config wins; only options given explicitly on this command line change it.
        ctx = click.get_current_context()
        param_of = {"eval_every_epoch": "no_eval", "progress": "no_progress"}
        explicit = {k: v for k, v in given.items()
                    if ctx.get_parameter_source(param_of.get(k, k)) == click.core.ParameterSource.COMMANDLINE}
        config = TrainConfig.from_dict({**json.loads(saved.read_text()), **explicit})
    else:
        config = TrainConfig(**given)
    _, metrics = run_training(config, resume=resume)
    if metrics:
        click.echo(format_metrics(metrics))


def _load(checkpoint: str):
    from bertzoo.tokenization import Tokenizer
    from bertzoo.trainer.checkpoint import TOKENIZER, load_model
    from bertzoo.trainer.config import TrainConfig

    model, config, directory = load_model(checkpoint)
    train_config = TrainConfig.from_dict(config["train"])
    return model, Tokenizer.from_file(directory / TOKENIZER), train_config, directory


@main.command("eval")
@click.argument("checkpoint", type=click.Path(exists=True))
@click.option("--data", "data_dir", type=click.Path(file_okay=False), default=None,
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
    from bertzoo.trainer.train import load_splits

    model, tokenizer, config, directory = _load(checkpoint)
    config.data_dir = data_dir
    config.tasks = _parse_tasks(tasks) if tasks else config.tasks
    if qa_null_threshold is not None:
        model.config.qa_null_threshold = qa_null_threshold
    metrics = evaluate(model, load_splits(config, split, limit), tokenizer, config.limits)
    click.echo(f"{directory} on {split}:")
    click.echo(format_metrics(metrics))
    if json_out:
        Path(json_out).write_text(json.dumps(metrics, indent=2))


@main.command()
@click.argument("checkpoint", type=click.Path(exists=True))
@click.option("--task", type=click.Choice(TASK_NAMES), required=True)
@click.argument("texts", nargs=-1, required=True)
def predict(checkpoint: str, task: str, texts: tuple[str, ...]) -> None:
    """Answer from CHECKPOINT. sentiment: TEXT...; paraphrase/similarity: TEXT_A TEXT_B; qa: QUESTION CONTEXT."""
    from bertzoo import tasks as T
    from bertzoo.data import PairExample, QAExample, SentenceExample
    from bertzoo.trainer.evaluate import predict_outputs

    model, tokenizer, config, _ = _load(checkpoint)
    if task == "sentiment":
        examples = [SentenceExample(str(i), t, None) for i, t in enumerate(texts)]
    elif len(texts) != 2:
        raise click.UsageError(f"--task {task} takes exactly two texts, got {len(texts)}")
    elif task == "qa":
        examples = [QAExample("0", texts[0], texts[1], (), (), False)]
    else:
        examples = [PairExample("0", texts[0], texts[1], None)]
    outputs = predict_outputs(model, task, examples, tokenizer, config.limits)
    if task == "sentiment":
        spec = T.task_spec("sentiment", config.sentiment_dataset)
        result = [r.__dict__ for r in T.postprocess_sentiment(outputs, spec)]
    elif task == "paraphrase":
        result = {"probability": float(T.postprocess_paraphrase(outputs)[0])}
    elif task == "similarity":
        result = {"score": float(T.postprocess_similarity(outputs)[0])}
    else:
        result = outputs[0].__dict__
    click.echo(json.dumps(result, indent=2))


@main.command("export")
@click.argument("checkpoint", type=click.Path(exists=True))
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Artifact directory to write.")
@click.option("--optimize", is_flag=True, help="Add an encoder with ONNX Runtime's transformer fusions.")
@click.option("--int8", is_flag=True, help="Add a dynamically int8-quantized encoder.")
@click.option("--per-channel/--per-tensor", default=True, help="int8 weight scales per output channel or per tensor.")
@click.option("--trt", is_flag=True, help="Add a TensorRT fp16 engine (needs tensorrt and an NVIDIA GPU).")
@click.option("--triton", is_flag=True, help="Add a Triton Inference Server model repository (triton/).")
@click.option("--data", "data_dir", type=click.Path(file_okay=False), default=None,
              help="Dev data for the task-level parity gates (default: the bundled samples).")
@click.option("--parity-limit", type=int, default=200, help="Dev examples per task for the parity gates.")
@click.option("--force", is_flag=True, help="Replace OUT if it exists.")
def export_command(checkpoint: str, out_dir: str, **options) -> None:
    """Export CHECKPOINT to an artifact directory the server loads without torch (ONNX, manifest, parity report)."""
    from bertzoo.export.exporter import ExportError, ExportOptions, export_checkpoint
    from bertzoo.export.tensorrt import TensorRTUnavailable

    try:
        manifest = export_checkpoint(checkpoint, out_dir, ExportOptions(**options))
    except (ExportError, TensorRTUnavailable) as e:
        raise click.ClickException(str(e)) from e
    for variant, report in manifest["parity"].items():
        shown = ", ".join(f"{t}: " + ", ".join(f"{k}={v:.4g}" for k, v in r.items() if k != "n")
                          for t, r in report["tasks"].items())
        click.echo(f"{variant:10s} encoder max abs diff {report['tensor_max_abs']['encoder']:.2e}; {shown}")
    click.echo(f"wrote {out_dir} ({len(manifest['files'])} files, manifest.json)")


if __name__ == "__main__":
    main()

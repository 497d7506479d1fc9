"""``bertzoo pretrain``: masked-language-model pre-training, optionally with attention guidance (paper 003)."""

from __future__ import annotations

import click

from .cli_parsing import parse_overrides

# PretrainConfig's defaults, repeated here so that `--help` works without importing torch; the test suite checks
# that they agree with the dataclass.
DEFAULTS = {"out_dir": "runs/pretrain", "backbone": "default", "max_steps": 1000, "batch_size": 32,
            "max_seq_length": 128, "lr": 1e-4, "warmup_ratio": 0.0, "seed": 0, "ag_weight": 0.0, "ag_fraction": 0.5,
            "ag_patterns": ("next", "prev", "first"), "log_every": 10, "eval_every": 0, "heldout_size": 512}


def _parse_patterns(value: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in value.split(",") if p.strip())


@click.command()
@click.argument("corpus", nargs=-1, type=click.Path(exists=True, dir_okay=False))
@click.option("--data", "data_dir", type=click.Path(exists=True, file_okay=False), default=None,
              help="Also use the sentences of this data directory's sentiment, paraphrase and similarity train files.")
@click.option("--sentiment-dataset", type=click.Choice(["sst5", "cfimdb", "sst2"]), default="sst5",
              help="Which sentiment train file of --data to read.")
@click.option("--out", "out_dir", default=DEFAULTS["out_dir"],
              help="Output directory: train_log.jsonl, loss_curve.png, backbone/.")
@click.option("--backbone", default=DEFAULTS["backbone"],
              help="'default' (all-MiniLM-L6-v2) or a HuggingFace BERT directory to start from.")
@click.option("--random-init", is_flag=True, help="Random weights from the backbone's config (see --encoder).")
@click.option("--encoder", "encoder_overrides", multiple=True, metavar="KEY=VALUE",
              help="Encoder config override, e.g. num_hidden_layers=4 hidden_size=256 num_attention_heads=4.")
@click.option("--max-steps", type=int, default=DEFAULTS["max_steps"], help="Optimizer steps.")
@click.option("--batch-size", type=int, default=DEFAULTS["batch_size"], help="Sequences per step.")
@click.option("--max-seq-length", type=int, default=DEFAULTS["max_seq_length"],
              help="Tokens per sequence; longer texts are cut.")
@click.option("--lr", type=float, default=DEFAULTS["lr"], help="Peak learning rate (AdamW).")
@click.option("--warmup-ratio", type=float, default=DEFAULTS["warmup_ratio"],
              help="Share of the steps over which the learning rate rises from 0.")
@click.option("--seed", type=int, default=DEFAULTS["seed"], help="Random seed.")
@click.option("--ag-weight", type=float, default=DEFAULTS["ag_weight"],
              help="Attention guidance alpha_0 (decayed linearly to 0); 0: off. The paper uses 100 for small models.")
@click.option("--ag-fraction", type=float, default=DEFAULTS["ag_fraction"], help="Share of guided heads per layer.")
@click.option("--ag-patterns", default=",".join(DEFAULTS["ag_patterns"]),
              help="Comma-separated, from first, next, prev, delim, period: one head each, the last fills the rest.")
@click.option("--log-every", type=int, default=DEFAULTS["log_every"],
              help="A train_log.jsonl record every N steps.")
@click.option("--eval-every", type=int, default=DEFAULTS["eval_every"],
              help="Held-out MLM loss every N steps (0: only at the end).")
@click.option("--heldout-size", type=int, default=DEFAULTS["heldout_size"],
              help="Sentences kept out of training for the held-out loss (at most a tenth of the corpus).")
@click.option("--no-progress", is_flag=True, help="No progress bar (logs only).")
def pretrain(corpus: tuple[str, ...], encoder_overrides: tuple[str, ...], ag_patterns: str, no_progress: bool,
             **options) -> None:
    """Masked-language-model pre-training on CORPUS text files (one sentence or paragraph per line) and/or --data;
    writes OUT/backbone, which `bertzoo train --backbone OUT/backbone` fine-tunes from."""
    from bertzoo.trainer.pretrain import PretrainConfig
    from bertzoo.trainer.pretrain import pretrain as run_pretraining

    if not corpus and not options["data_dir"]:
        raise click.UsageError("give CORPUS text files and/or --data DIR")
    try:
        config = PretrainConfig(corpus=corpus, encoder_overrides=parse_overrides(encoder_overrides),
                                ag_patterns=_parse_patterns(ag_patterns), progress=not no_progress, **options)
    except ValueError as e:
        raise click.UsageError(str(e)) from e
    result = run_pretraining(config)
    held_out = "n/a (corpus too small)" if result.heldout_mlm_loss is None else f"{result.heldout_mlm_loss:.4f}"
    click.echo(f"held-out MLM loss: {held_out}")
    click.echo(f"wrote {result.backbone_dir} (bertzoo train --backbone {result.backbone_dir})")

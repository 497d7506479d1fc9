"""``bertzoo zoo list|show`` (the preset registry) and ``bertzoo viz`` (attention heatmaps of a checkpoint)."""

from __future__ import annotations

from pathlib import Path

import click

from .zoo import PresetError, load_preset, preset_names


@click.group()
def zoo() -> None:
    """The attention-variant zoo's presets (core/presets/*.toml)."""


@zoo.command("list", short_help="Each preset, its description and its paper.")
def zoo_list() -> None:
    """Each preset with its one-line description and the paper it implements."""
    presets = [load_preset(name) for name in preset_names()]
    width = max(len(p.name) for p in presets)
    for p in presets:
        click.echo(f"{p.name:<{width}}  {p.description}")
        click.echo(f"{'':<{width}}  paper: {p.paper}")


@zoo.command("show", short_help="The resolved training config of a preset.")
@click.argument("name")
def zoo_show(name: str) -> None:
    """The resolved training config of preset NAME (or a preset .toml file): defaults, then the preset."""
    try:
        preset = load_preset(name)
    except PresetError as e:
        raise click.ClickException(str(e)) from e
    click.echo(f"# {preset.name}: {preset.description}\n# paper: {preset.paper}\n# file: {preset.path}")
    click.echo(preset.config().to_json())


@click.command()
@click.argument("checkpoint", type=click.Path(exists=True))
@click.argument("text")
@click.option("--out", "out_path", default="attention.png", type=click.Path(dir_okay=False),
              help="PNG to write (layers x heads grid).")
@click.option("--heads", default=None, help="Comma-separated head indices to draw [default: all].")
@click.option("--max-length", type=int, default=64, help="Truncate the sentence to this many tokens.")
def viz(checkpoint: str, text: str, out_path: str, heads: str | None, max_length: int) -> None:
    """Draw CHECKPOINT's encoder attention on TEXT as PNG heatmaps, one per layer and head, tokens on both axes, and
    print the fraction of exactly-zero weights per layer (the sparsity SSAF adds)."""
    import torch

    from bertzoo.tokenization import Tokenizer
    from bertzoo.trainer.checkpoint import TOKENIZER, load_model
    from bertzoo.trainer.plots import attention_grid

    model, config, directory = load_model(checkpoint)
    tokenizer = Tokenizer.from_file(directory / TOKENIZER)
    if not text.strip():
        raise click.BadParameter("the text is empty", param_hint="TEXT")
    encoding = tokenizer.encode_sentences([text], max_length)[0]
    ids = torch.tensor([encoding.input_ids])
    model.eval()
    with torch.no_grad():
        out = model.encoder(ids, torch.ones_like(ids), torch.tensor([encoding.token_type_ids]), output_attentions=True)
    attentions = torch.stack([a[0] for a in out.attentions]).float().numpy()  # [layers, heads, T, T]
    num_heads = attentions.shape[1]
    chosen = None
    if heads:
        try:
            chosen = [int(h) for h in heads.split(",")]
        except ValueError as e:
            raise click.BadParameter(f"{heads!r} is not a comma-separated list of integers", param_hint="--heads") from e
        bad = [h for h in chosen if not 0 <= h < num_heads]
        if bad:
            raise click.BadParameter(f"head(s) {bad} out of range: the model has {num_heads} heads per layer",
                                     param_hint="--heads")
    encoder = model.config.encoder
    function = encoder.attention if encoder.attention == "softmax" else f"sparsegen-lin lambda={encoder.sparsegen_lambda}"
    title = f"{Path(str(directory)).parent.name}/{directory.name}: {function}"
    path = attention_grid(out_path, attentions, tokenizer.tokens(encoding.input_ids), title, chosen)
    for layer, probs in enumerate(attentions):
        click.echo(f"layer {layer}: {float((probs == 0).mean()):.1%} of attention weights are exactly zero")
    click.echo(f"wrote {path}")

"""Checkpoints: written atomically as safetensors + JSON (never pickle), read back for resume, eval and export.

Layout of a training run's output directory::

    OUT/
      train_log.jsonl             one JSON object per logged step and per evaluation
      checkpoint-000120/          one directory per saved step
        config.json               {"model": ModelConfig, "train": TrainConfig, "step", "bertzoo_version"}
        model.safetensors         model weights
        tokenizer.json            the tokenizer, so the checkpoint stands alone
        metrics.json              dev metrics at this step (if evaluated)
        trainer_state.safetensors optimizer moments and the torch RNG state (for --resume)
        trainer_state.json        optimizer hyper-parameters, step, epoch
      LATEST, BEST                the name of the newest / best checkpoint directory

A checkpoint directory is written under a temporary name and renamed into place, and the pointer files are replaced
with os.replace, so an interrupted run never leaves a half-written checkpoint behind a pointer.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

import bertzoo
from bertzoo.atomic import atomic_directory, atomic_write_text
from bertzoo.errors import UserError

from .heads import ModelConfig, MultitaskModel

CONFIG, WEIGHTS, TOKENIZER, METRICS = "config.json", "model.safetensors", "tokenizer.json", "metrics.json"
STATE_TENSORS, STATE_JSON = "trainer_state.safetensors", "trainer_state.json"


class CheckpointError(UserError):
    """A checkpoint cannot be loaded; the message names the file."""


class NotACheckpoint(CheckpointError, FileNotFoundError):
    """The path is neither a checkpoint directory nor a run directory that points to one."""


class RunExists(UserError):
    """`bertzoo train` was pointed at a directory that holds a run, without --resume or --force."""


# What a training run writes into its directory (and the temporary names of its atomic writes): what --force removes,
# so the new run's log, pointers and checkpoints never mix with the old one's; anything else there is left alone.
RUN_ENTRIES = ("train_config.json", "train_log.jsonl", "LATEST", "BEST", "curves.png", "checkpoint-*", ".checkpoint-*",
               ".train_config.json.*", ".train_log.jsonl.*", ".LATEST.*", ".BEST.*")


def run_entries(out_dir: Path) -> list[Path]:
    """The files and checkpoint directories of a training run in ``out_dir`` (none: it holds no run)."""
    return sorted({p for pattern in RUN_ENTRIES for p in out_dir.glob(pattern)}) if out_dir.is_dir() else []


def first_free_run_dir(base: Path) -> Path:
    """``base``, else ``base-2``, ``base-3``, ...: the first that holds no run. Where `bertzoo train` puts a run given
    no --out, so the same command run twice keeps both runs, as ultralytics' runs/train, train2, ... do."""
    candidate, number = base, 1
    while run_entries(candidate):
        number += 1
        candidate = base.with_name(f"{base.name}-{number}")
    return candidate


def claim_run_dir(out_dir: Path, resume: bool, force: bool, remove: bool = True) -> None:
    """Refuse to start a new run over an existing one (a repeated command must not take over a finished run); with
    ``force``, remove the old run's entries first. ``remove``: False on the ranks of a distributed run other than 0,
    so a single process deletes."""
    if resume and force:
        raise RunExists("--resume continues the run in --out and --force replaces it: pass one of them")
    entries = run_entries(out_dir)
    if resume or not entries:
        return
    if not force:
        raise RunExists(f"{out_dir} already holds a training run; pass --resume to continue it, --force to replace "
                        "it, or another --out")
    for entry in entries if remove else []:
        if entry.is_dir():
            shutil.rmtree(entry)
        else:
            entry.unlink(missing_ok=True)


def _optimizer_to_files(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict]:
    state = optimizer.state_dict()
    tensors = {}
    for index, param_state in state["state"].items():
        for name, value in param_state.items():
            tensors[f"optimizer.{index}.{name}"] = value.detach().cpu().contiguous()
    return tensors, {"param_groups": state["param_groups"]}


def _optimizer_from_files(tensors: dict[str, torch.Tensor], meta: dict) -> dict:
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        if key.startswith("optimizer."):
            _, index, name = key.split(".", 2)
            state.setdefault(int(index), {})[name] = value
    return {"state": state, "param_groups": meta["param_groups"]}


def save_checkpoint(
    out_dir: Path,
    step: int,
    model: MultitaskModel,
    train_config: dict,
    tokenizer_json: str,
    metrics: dict | None,
    optimizer: torch.optim.Optimizer | None,
    trainer_state: dict,
    keep: int = 2,
    is_best: bool = False,
    state_tensors: dict[str, torch.Tensor] | None = None,
) -> Path:
    """``state_tensors``: more tensors for --resume (e.g. the raw weights beside averaged ones), kept in the trainer
    state."""
    name = f"checkpoint-{step:06d}"
    final = out_dir / name
    config = {"model": model.config.to_dict(), "train": train_config, "step": step, "bertzoo_version": bertzoo.__version__}
    tensors = {"rng.torch": torch.get_rng_state(), **{k: v.detach().cpu().contiguous()
                                                      for k, v in (state_tensors or {}).items()}}
    meta = dict(trainer_state)
    if optimizer is not None:
        opt_tensors, opt_meta = _optimizer_to_files(optimizer)
        tensors.update(opt_tensors)
        meta["optimizer"] = opt_meta
    # Re-saving the same step (e.g. after a resume) replaces that checkpoint whole.
    with atomic_directory(final, shareable=True) as tmp:
        (tmp / CONFIG).write_text(json.dumps(config, indent=2), encoding="utf-8")
        save_file({k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}, str(tmp / WEIGHTS))
        (tmp / TOKENIZER).write_text(tokenizer_json, encoding="utf-8")
        (tmp / METRICS).write_text(json.dumps(metrics or {}, indent=2), encoding="utf-8")
        save_file(tensors, str(tmp / STATE_TENSORS))
        (tmp / STATE_JSON).write_text(json.dumps(meta, indent=2), encoding="utf-8")
    atomic_write_text(out_dir / "LATEST", name)
    if is_best:
        atomic_write_text(out_dir / "BEST", name)
    _prune(out_dir, keep)
    return final


def _prune(out_dir: Path, keep: int) -> None:
    protected = {(out_dir / p).read_text().strip() for p in ("LATEST", "BEST") if (out_dir / p).exists()}
    checkpoints = sorted(p.name for p in out_dir.glob("checkpoint-*") if p.is_dir())
    for name in checkpoints[:-keep] if keep > 0 else []:
        if name not in protected:
            shutil.rmtree(out_dir / name, ignore_errors=True)
    for stale in out_dir.glob(".checkpoint-*"):  # temporary directories of an interrupted save
        shutil.rmtree(stale, ignore_errors=True)


def resolve_checkpoint(path: str | Path, prefer: str = "BEST") -> Path:
    """A checkpoint directory, or a run directory (then its BEST, else LATEST, checkpoint)."""
    return resolve_checkpoint_pointer(path, prefer)[0]


def resolve_checkpoint_pointer(path: str | Path, prefer: str = "BEST") -> tuple[Path, str | None]:
    """:func:`resolve_checkpoint`, and which pointer file chose it ("BEST", "LATEST"; None for a checkpoint dir)."""
    path = Path(path)
    if (path / WEIGHTS).is_file() and (path / CONFIG).is_file():
        return path, None
    for pointer in (prefer, "LATEST"):
        if (path / pointer).is_file():
            target = path / (path / pointer).read_text().strip()
            if (target / WEIGHTS).is_file():
                return target, pointer
    raise NotACheckpoint(f"{path}: neither a checkpoint directory (with {WEIGHTS} and {CONFIG}) nor a run directory "
                         "with a LATEST or BEST checkpoint; pass the --out directory of `bertzoo train` or one of its "
                         "checkpoint-* folders")


def load_model(path: str | Path) -> tuple[MultitaskModel, dict, Path]:
    """The model of a checkpoint (or a run's best checkpoint), in eval mode, with its saved config."""
    directory = resolve_checkpoint(path)
    try:
        config = json.loads((directory / CONFIG).read_text(encoding="utf-8"))
        model = MultitaskModel(ModelConfig.from_dict(config["model"]))
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{directory / CONFIG}: not a bertzoo checkpoint config ({e})") from e
    load_weights(model, directory, "copy it again, or use another checkpoint of the run")
    model.eval()
    return model, config, directory


def load_weights(model: MultitaskModel, directory: Path, remedy: str) -> None:
    """Load a checkpoint's weights into ``model``; an unreadable or mismatched file is a CheckpointError naming it
    and ``remedy`` (what the caller's user can do about it)."""
    try:
        state = load_file(str(directory / WEIGHTS))
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{directory / WEIGHTS}: unreadable, truncated or corrupt ({e}); {remedy}") from e
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise CheckpointError(f"{directory / WEIGHTS}: does not match {directory / CONFIG} ({e})") from e


def load_trainer_state(directory: Path) -> tuple[dict, dict | None, dict[str, torch.Tensor]]:
    """(trainer state JSON, optimizer state_dict or None, its tensors: "rng.torch", the optimizer's and any
    ``state_tensors`` saved with it) of a checkpoint, for --resume."""
    try:
        meta = json.loads((directory / STATE_JSON).read_text(encoding="utf-8"))
        tensors = load_file(str(directory / STATE_TENSORS))
    except (OSError, json.JSONDecodeError, SafetensorError) as e:
        raise CheckpointError(f"{directory}: its trainer state ({STATE_JSON}, {STATE_TENSORS}) is unreadable, "
                              f"truncated or corrupt ({e}); resume from another checkpoint by pointing LATEST at it, "
                              "or start a new run") from e
    optimizer = _optimizer_from_files(tensors, meta["optimizer"]) if "optimizer" in meta else None
    return meta, optimizer, tensors

"""The multitask training loop: one task per step, per-epoch dev evaluation, atomic checkpoints (at epoch ends and
by ``save_every`` / ``save_every_minutes``), resume, and torchrun/DDP when launched with several processes.

    bertzoo train --data DIR --out runs/x                       # one process
    torchrun --nproc_per_node 2 -m bertzoo.cli train ...      # DDP: gloo on CPU, nccl on GPUs

The loop's parts live beside it: the process's rank, device and seeds in ``launch.py``, AdamW with layer-wise decay
and the warmup-then-linear-decay schedule in ``optimizer.py``, the task losses in ``losses.py``, the auxiliary
objectives in ``objectives.py``, the data streams and task sampling in ``batches.py``. ``task_loss`` is looked up in
this module at each step (the tests replace it here to stop a run at a chosen step).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import fields
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from tqdm import tqdm

from bertzoo.allocator import describe as describe_allocator
from bertzoo.atomic import atomic_write_text
from bertzoo.backbone import resolve_backbone
from bertzoo.tasks import task_spec
from bertzoo.tokenization import Tokenizer

from . import checkpoint as ckpt
from .averaging import RAW_PREFIX, WeightAverage, averaged, restore_raw
from .batches import TaskStream, build_features, collate, task_for_step
from .calibration import calibrate_null_threshold
from .config import TrainConfig
from .evaluate import evaluate
from .heads import ModelConfig, MultitaskModel
from .launch import Dist, seed_everything, setup_distributed
from .losses import task_loss
from .model import EncoderConfig
from .objectives import build_objectives
from .optimizer import lr_factor, make_optimizer
from .plots import training_curves
from .precision import autocast_context, cpu_precision_advice
from .prioritization import TaskPrioritizer, broadcast, primary_scores, reprioritize
from .sparsity import attention_zero_fraction
from .training_data import check_data_files, load_splits, load_training_data

log = logging.getLogger("bertzoo.train")


def build_model(config: TrainConfig) -> tuple[MultitaskModel, Tokenizer]:
    """The multitask model the config describes, on the backbone's weights (or fresh ones with ``random_init``), and
    the backbone's tokenizer."""
    backbone = resolve_backbone(config.backbone, random_init=config.random_init)
    encoder_config = EncoderConfig.from_dict(backbone.config(), **config.encoder_overrides)
    num_labels = len(task_spec("sentiment", config.sentiment_dataset).labels)
    # Every model setting the training config also names (tasks, pooling, the heads, ...) comes from it.
    shared = {f.name: getattr(config, f.name) for f in fields(ModelConfig) if hasattr(config, f.name)}
    model = MultitaskModel(ModelConfig(encoder_config, sentiment_num_labels=num_labels, **shared))
    if backbone.weights_path is not None:
        model.encoder.load_pretrained(backbone.weights_path)
    model.pack_tokens = config.pack_tokens
    return model, backbone.tokenizer()


def train(config: TrainConfig, resume: bool = False) -> tuple[MultitaskModel, dict]:
    """Train; returns the (unwrapped) model and the last dev metrics."""
    check_data_files(config)
    env = setup_distributed()
    seed_everything(config.seed)
    out_dir = Path(config.out_dir)
    if env.is_main:
        out_dir.mkdir(parents=True, exist_ok=True)
        log.info("effective config:\n%s", config.to_json())
        log.info("memory allocator: %s", describe_allocator())
        atomic_write_text(out_dir / "train_config.json", config.to_json())
        if advice := cpu_precision_advice(config.precision, env.device):
            log.log(logging.WARNING if config.precision == "bf16" else logging.INFO, advice)  # emulated bf16: slow

    model, tokenizer = build_model(config)
    limits = config.limits
    train_splits, calibration = load_training_data(config)
    dev_splits = load_splits(config, "dev", config.eval_limit_per_task) if config.eval_every_epoch else {}
    streams = {
        task: TaskStream(task, build_features(task, examples, tokenizer, limits), config.batch_size, config.seed,
                         env.rank, env.world_size, config.batch_tokens_of(task))
        for task, examples in train_splits.items()
    }
    tasks = list(streams)
    weight = {t: config.task_weights.get(t, 1.0) for t in tasks}
    sizes = [streams[t].sampling_size * weight[t] for t in tasks]
    epoch_steps = max(1, round(sum(streams[t].batches_per_pass * weight[t] for t in tasks)))
    total_steps = config.max_steps or max(1, round(config.epochs * epoch_steps))
    if env.is_main:
        log.info("training items per task: %s; %d steps per epoch; %d steps in all",
                 {t: len(s.features) for t, s in streams.items()}, epoch_steps, total_steps)
    prioritizer, dtp_splits = None, {}
    if config.sampling == "dynamic":  # paper 004's dynamic task prioritization (trainer/prioritization.py)
        prioritizer = TaskPrioritizer(tasks, config.dtp_smoothing_start, config.dtp_smoothing_end)
        # Its own dev slice, loaded whether or not eval_every_epoch is on; the train slice is the gap's reference.
        dtp_splits = {"dev": load_splits(config, "dev", config.dtp_eval_limit)}
        if config.dtp_reference == "train":
            dtp_splits["train"] = {t: examples[:config.dtp_eval_limit] for t, examples in train_splits.items()}

    model.to(env.device)
    objectives = build_objectives(config, tokenizer)
    needs_attentions = any(o.needs_attentions for o in objectives)
    optimizer = make_optimizer(model, config.lr, config.weight_decay, config.head_lr, config.lr_layer_decay)
    average = WeightAverage(model, config.weight_average, total_steps) if config.weight_average else None
    start_step, best, metrics = 0, float("-inf"), {}
    if resume and (out_dir / "LATEST").exists():
        start_step, best, metrics = _resume(out_dir, env, model, optimizer, average, streams, prioritizer, best)
    elif env.is_main:  # from step 0 (e.g. --resume of a run killed before its first checkpoint): no step twice
        _drop_log_records_after(out_dir / "train_log.jsonl", 0)

    ddp_model = model
    if env.world_size > 1:
        # Each step trains one task, so the other heads get no gradient: DDP must be told.
        ddp_model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[env.device.index] if env.device.type == "cuda" else None,
            find_unused_parameters=True,
        )
    model.train()
    log_file = open(out_dir / "train_log.jsonl", "a", encoding="utf-8") if env.is_main else None
    bar = tqdm(total=total_steps, initial=start_step, disable=not (config.progress and env.is_main),
               desc="train", dynamic_ncols=True)
    window_losses: dict[str, list[float]] = {t: [] for t in tasks}
    step_seconds: dict[str, list[float]] = {}  # per task, data to optimizer step: the zoo's cost ratios use these
    started = last_save = time.perf_counter()
    try:
        for step in range(start_step, total_steps):
            step_started = time.perf_counter()
            for objective in objectives:
                objective.prepare(step, total_steps, model, streams)
            task = task_for_step(step, tasks, sizes, config.sampling, total_steps, config.seed,
                                 config.anneal_min_alpha, weights=prioritizer.weights if prioritizer else None)
            indices = streams[task].next_indices()
            batch = {k: v.to(env.device) for k, v in collate(task, [streams[task].features[i] for i in indices],
                                                                tokenizer.pad_id).items()}
            for group in optimizer.param_groups:
                group["lr"] = group["base_lr"] * lr_factor(step, total_steps, config.warmup_ratio)
            with autocast_context(config.precision, env.device):
                details = ddp_model(task, batch, details=True, output_attentions=needs_attentions)
                loss = task_loss(task, details.outputs, batch, config.similarity_loss)
                window_losses[task].append(loss.item())  # the task's own loss; auxiliary ones are logged apart
                for objective in objectives:
                    extra = objective.loss(task, indices, batch, details, step / total_steps)
                    if extra is not None:
                        window_losses.setdefault(objective.name, []).append(extra.item())
                        loss = loss + extra
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if average is not None:
                average.update()
            step_seconds.setdefault(task, []).append(time.perf_counter() - step_started)
            bar.update(1)
            bar.set_postfix(task=task, loss=f"{loss.item():.3f}")
            done = step + 1
            if log_file and (done % config.log_every == 0 or done == total_steps):
                record = {"step": done, "lr": optimizer.param_groups[0]["lr"], "grad_norm": float(grad_norm),
                          "elapsed_s": round(time.perf_counter() - started, 2),
                          "step_ms": {t: round(1000 * float(np.median(v)), 2) for t, v in step_seconds.items()},
                          "loss": {t: float(np.mean(v)) for t, v in window_losses.items() if v}}
                if prioritizer is not None:
                    record["task_weights"] = dict(zip(tasks, prioritizer.weights, strict=True))
                log_file.write(json.dumps(record) + "\n")
                log_file.flush()
                window_losses, step_seconds = {t: [] for t in tasks}, {}
            if prioritizer is not None and done % config.dtp_every == 0 and done < total_steps:
                if env.is_main:  # before the checkpoint below, so a resume starts from the new weights
                    dtp = reprioritize(prioritizer, model, dtp_splits, tokenizer, limits, config.sentiment_dataset,
                                       done / total_steps)
                    log.info("step %d: task weights %s", done, {t: round(w, 3) for t, w in dtp["weights"].items()})
                    if log_file:
                        log_file.write(json.dumps({"step": done, "dtp": dtp}) + "\n")
                        log_file.flush()
                broadcast(prioritizer)
            extra_state = {"prioritizer": prioritizer.state_dict()} if prioritizer else {}
            if average is not None:
                extra_state["average_updates"] = average.updates
            if done % epoch_steps == 0 or done == total_steps:
                with averaged(average) as raw:  # evaluated and saved: the averaged weights, if averaging
                    metrics, best = _end_of_epoch(config, env, model, optimizer, tokenizer, dev_splits, calibration,
                                                  streams, done, best, log_file, extra_state, raw)
                last_save = time.perf_counter()
            elif _checkpoint_due(config, env, done, last_save):
                with averaged(average) as raw:
                    _save(config, env, model, optimizer, tokenizer, {}, streams, done, best, False, extra_state, raw)
                last_save = time.perf_counter()
    finally:
        bar.close()
        if log_file:
            log_file.close()
    if average is not None:
        average.keep()  # the model returned is the one saved
    return model, metrics


def _resume(out_dir: Path, env: Dist, model: MultitaskModel, optimizer: torch.optim.Optimizer,
            average: WeightAverage | None, streams: dict[str, TaskStream], prioritizer: TaskPrioritizer | None,
            best: float) -> tuple[int, float, dict]:
    """Restore everything the checkpoint that ``out_dir``'s LATEST names holds (weights, optimizer, torch's
    generator, each task's place in its data, the task weights, the average) so the run goes on as if never stopped:
    (its step, its best dev score, its metrics)."""
    directory = ckpt.resolve_checkpoint(out_dir, prefer="LATEST")
    ckpt.load_weights(model, directory, f"write the name of an earlier checkpoint-* of the run into "
                      f"{out_dir / 'LATEST'} to resume from there, or start over with --force")
    meta, opt_state, state_tensors = ckpt.load_trainer_state(directory)
    if any(k.startswith(RAW_PREFIX) for k in state_tensors):  # the run was averaging: it saved the average
        if average is not None:
            average.resume(state_tensors, meta.get("average_updates", 0))
        else:
            restore_raw(model, state_tensors)
    if opt_state is not None:
        optimizer.load_state_dict(opt_state)
    torch.set_rng_state(state_tensors["rng.torch"])
    for task, state in meta["streams"].items():
        streams[task].load_state_dict(state)
    if prioritizer is not None and "prioritizer" in meta:
        prioritizer.load_state_dict(meta["prioritizer"])
    start_step, best = meta["step"], meta.get("best", best)
    metrics = json.loads((directory / ckpt.METRICS).read_text())
    if env.is_main:
        log.info("resumed from %s at step %d", directory, start_step)
        _drop_log_records_after(out_dir / "train_log.jsonl", start_step)
    return start_step, best, metrics


def _end_of_epoch(config: TrainConfig, env: Dist, model: MultitaskModel, optimizer: torch.optim.Optimizer,
                  tokenizer: Tokenizer, dev_splits: dict[str, list], calibration: list,
                  streams: dict[str, TaskStream], step: int, best: float, log_file, extra_state: dict | None = None,
                  state_tensors: dict | None = None) -> tuple[dict, float]:
    """Rank 0 fits the no-answer threshold (if QA questions were held out for it), evaluates on dev (if asked) and
    saves a checkpoint; the other ranks wait for it."""
    metrics: dict = {}
    is_best = False
    if env.is_main:
        if calibration:  # before dev evaluation and the save, so both use this checkpoint's own threshold
            fitted = calibrate_null_threshold(model, calibration, tokenizer, config.limits,
                                              config.qa_calibration_share, progress=config.progress)
            log.info("step %d: no-answer threshold %.3f fitted on %d held-out questions (held-out F1 %.2f, "
                     "%.2f at the previous %.3f)", step, fitted["threshold"], fitted["questions"],
                     fitted["f1_at_threshold"], fitted["f1_at_previous"], fitted["previous_threshold"])
            if log_file:
                log_file.write(json.dumps({"step": step, "qa_calibration": fitted}) + "\n")
        if dev_splits:
            metrics = evaluate(model, dev_splits, tokenizer, config.limits, progress=config.progress)
            log.info("dev metrics at step %d: %s", step, json.dumps(metrics))
            # "best" = the mean of each task's primary metric (QA F1 rescaled from percent to [0, 1]).
            score = float(np.nanmean(list(primary_scores(metrics, config.sentiment_dataset).values())))
            is_best = score > best
            best = max(best, score)
            record = {"step": step, "dev": metrics, "dev_score": score}
            if model.config.encoder.attention != "softmax" and "sentiment" in dev_splits:
                # SSAF's visible effect: the share of exactly-zero attention weights per layer on dev sentences.
                encodings = build_features("sentiment", dev_splits["sentiment"][:256], tokenizer, config.limits)
                record["attention_zero_fraction"] = attention_zero_fraction(
                    model.encoder, [f.encodings[0] for f in encodings], tokenizer.pad_id)
                log.info("exactly-zero attention weights per layer: %s",
                         " ".join(f"{z:.1%}" for z in record["attention_zero_fraction"]))
            log_file.write(json.dumps(record) + "\n")
            log_file.flush()
        if log_file:
            log_file.flush()
            training_curves(Path(config.out_dir) / "train_log.jsonl", Path(config.out_dir) / "curves.png")
    _save(config, env, model, optimizer, tokenizer, metrics, streams, step, best, is_best or not dev_splits,
          extra_state, state_tensors)
    return metrics, best


def _save(config: TrainConfig, env: Dist, model: MultitaskModel, optimizer: torch.optim.Optimizer,
          tokenizer: Tokenizer, metrics: dict, streams: dict[str, TaskStream], step: int, best: float, is_best: bool,
          extra_state: dict | None, state_tensors: dict | None = None) -> None:
    """Rank 0 writes a checkpoint (atomically; everything --resume needs); the other ranks wait for it."""
    if env.is_main:
        state = {"step": step, "best": best, "streams": {t: s.state_dict() for t, s in streams.items()},
                 **(extra_state or {})}
        path = ckpt.save_checkpoint(Path(config.out_dir), step, model, config.to_dict(), tokenizer.to_str(), metrics,
                                    optimizer, state, keep=config.keep_checkpoints, is_best=is_best,
                                    state_tensors=state_tensors)
        log.info("saved %s%s", path, " (best so far)" if is_best and metrics else "")
    if env.world_size > 1:
        dist.barrier()


def _checkpoint_due(config: TrainConfig, env: Dist, done: int, last_save: float) -> bool:
    """A checkpoint between epochs: every ``save_every`` steps, or ``save_every_minutes`` after the last one (rank
    0's clock decides for every rank)."""
    due = bool(config.save_every and done % config.save_every == 0)
    if config.save_every_minutes and not due:
        due = time.perf_counter() - last_save >= 60.0 * config.save_every_minutes
        if env.world_size > 1:
            flag = torch.tensor([int(due)], device=env.device)
            dist.broadcast(flag, src=0)
            due = bool(flag.item())
    return due


def _drop_log_records_after(path: Path, step: int) -> None:
    """A resumed run redoes the steps after its checkpoint: their records from the killed run go, so none repeats."""
    if path.is_file():
        kept = [line for line in path.read_text(encoding="utf-8").splitlines(keepends=True)
                if line.strip() and json.loads(line).get("step", 0) <= step]
        atomic_write_text(path, "".join(kept))

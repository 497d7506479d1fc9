"""Masked-language-model pre-training (``bertzoo pretrain``), optionally with attention guidance (paper 003): the
config, the corpus, the loop with its held-out evaluation and run log, and the files a run leaves. The objective
itself (BERT's masking, the MLM head, the backbone's HuggingFace format) is ``masked_lm.py``'s; the optimizer and
schedule are fine-tuning's (``optimizer.py``).

Output directory::

    OUT/
      pretrain_config.json   the PretrainConfig
      train_log.jsonl        {"step", "lr", "mlm_loss", "ag_loss", "elapsed_s", "step_ms"} every --log-every steps,
                             {"step", "heldout_mlm_loss"} at each held-out evaluation
      loss_curve.png         training (and held-out) MLM loss, and the weighted AG loss
      backbone/              a HuggingFace-format BERT directory (config.json, model.safetensors, tokenizer.json):
                             ``bertzoo train --backbone OUT/backbone`` fine-tunes from it
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from tqdm import tqdm

from bertzoo.atomic import atomic_write_text
from bertzoo.backbone import resolve_backbone
from bertzoo.datafiles import load_split
from bertzoo.tokenization import Tokenizer, pad_batch

from .guidance import AttentionGuidance, check_patterns
from .launch import seed_everything
from .masked_lm import MaskedLM, mask_tokens, save_backbone, special_ids
from .model import EncoderConfig
from .optimizer import lr_factor, make_optimizer
from .plots import line_plot

log = logging.getLogger("bertzoo.pretrain")


@dataclass
class PretrainConfig:
    corpus: tuple[str, ...] = ()  # plain-text files, one sentence or paragraph per line
    data_dir: str | None = None  # also: the sentences of this data directory's sentiment/paraphrase/similarity train files
    sentiment_dataset: str = "sst5"
    out_dir: str = "runs/pretrain"
    backbone: str = "default"  # "default" (all-MiniLM-L6-v2) or a HuggingFace BERT directory
    random_init: bool = False  # the backbone's config (plus encoder_overrides) with fresh weights
    encoder_overrides: dict = field(default_factory=dict)
    max_steps: int = 1000
    batch_size: int = 32
    max_seq_length: int = 128
    lr: float = 1e-4
    weight_decay: float = 0.01
    warmup_ratio: float = 0.0  # the paper's AG runs use no warmup
    grad_clip: float = 1.0
    mask_prob: float = 0.15
    heldout_size: int = 512  # sentences kept out of training (at most a tenth of the corpus) for the held-out loss
    eval_every: int = 0  # held-out evaluation every N steps; 0: only at the end
    ag_weight: float = 0.0  # alpha_0 of attention guidance; 0 turns it off
    ag_fraction: float = 0.5
    ag_patterns: tuple[str, ...] = ("next", "prev", "first")
    seed: int = 0
    log_every: int = 10
    progress: bool = True

    def __post_init__(self) -> None:
        self.corpus, self.ag_patterns = tuple(self.corpus), tuple(self.ag_patterns)
        if not self.corpus and not self.data_dir:
            raise ValueError("pre-training needs a corpus: text files and/or a data directory")
        for name in ("max_steps", "batch_size", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_seq_length < 3:
            raise ValueError(f"max_seq_length must be >= 3 ([CLS] token [SEP]), got {self.max_seq_length}")
        if not 0.0 < self.mask_prob < 1.0:
            raise ValueError(f"mask_prob must be in (0, 1), got {self.mask_prob}")
        if self.ag_weight < 0 or not 0.0 <= self.ag_fraction <= 1.0:
            raise ValueError(f"need ag_weight >= 0 and ag_fraction in [0, 1], got {self.ag_weight}, {self.ag_fraction}")
        check_patterns(self.ag_patterns)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)


@dataclass
class PretrainResult:
    backbone_dir: Path
    heldout_mlm_loss: float | None
    train_curve: tuple[list[int], list[float]]  # (step, mean MLM loss of the logging window)
    heldout_curve: tuple[list[int], list[float]]
    median_step_ms: float


# ---------------------------------------------------------------- corpus


def load_corpus(files: tuple[str, ...] = (), data_dir: str | None = None, sentiment_dataset: str = "sst5") -> list[str]:
    """Non-empty stripped lines of ``files``, then the texts of the data directory's sentence-level train splits
    (sentiment sentences, both sides of the paraphrase and similarity pairs); duplicates dropped, first kept, so a
    sentence never lands both in training and in the held-out slice."""
    texts: list[str] = []
    for path in files:
        texts.extend(line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines())
    if data_dir:
        for task in ("sentiment", "paraphrase", "similarity"):
            for example in load_split(data_dir, task, "train", sentiment_dataset):
                texts.extend([example.text] if task == "sentiment" else [example.text_a, example.text_b])
    return [t for t in dict.fromkeys(texts) if t]


# ---------------------------------------------------------------- model


def build_model(config: PretrainConfig) -> tuple[MaskedLM, Tokenizer]:
    backbone = resolve_backbone(config.backbone, random_init=config.random_init)
    encoder_config = EncoderConfig.from_dict(backbone.config(), **config.encoder_overrides)
    tokenizer = backbone.tokenizer()
    if tokenizer.vocab_size > encoder_config.vocab_size:
        raise ValueError(f"the tokenizer has {tokenizer.vocab_size} tokens, the encoder only {encoder_config.vocab_size}")
    if config.max_seq_length > encoder_config.max_position_embeddings:
        raise ValueError(f"max_seq_length {config.max_seq_length} exceeds the encoder's max_position_embeddings "
                         f"{encoder_config.max_position_embeddings}")
    model = MaskedLM(encoder_config)
    if backbone.weights_path is None:
        log.info("encoder and MLM head: random initialisation from %s", backbone.config_path)
    else:
        model.bert.load_pretrained(backbone.weights_path)
        if model.load_head(backbone.weights_path):
            log.info("MLM head: loaded cls.predictions.* from %s", backbone.weights_path)
        else:
            log.info("MLM head: %s has no cls.predictions.* weights; initialised fresh", backbone.weights_path)
    return model, tokenizer


# ---------------------------------------------------------------- training


def _batch(encodings: list, pad_id: int) -> tuple[Tensor, Tensor]:
    padded = pad_batch(encodings, pad_id)
    return torch.from_numpy(padded["input_ids"]), torch.from_numpy(padded["attention_mask"])


@torch.no_grad()
def heldout_loss(model: MaskedLM, batches: list[tuple[Tensor, Tensor, Tensor]], device: torch.device) -> float:
    """Token-weighted mean MLM loss over fixed (pre-masked) held-out batches, dropout off."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for inputs, mask, labels in batches:
        loss, _, n = model(inputs.to(device), mask.to(device), labels.to(device))
        total, count = total + float(loss) * n, count + n
    model.train(was_training)
    return total / max(1, count)


def pretrain(config: PretrainConfig) -> PretrainResult:
    """Pre-train, write OUT (see the module docstring) and return the curves and the final held-out loss."""
    seed_everything(config.seed)
    out_dir = Path(config.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    log.info("pre-training config:\n%s", config.to_json())
    atomic_write_text(out_dir / "pretrain_config.json", config.to_json())
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    model, tokenizer = build_model(config)
    texts = load_corpus(config.corpus, config.data_dir, config.sentiment_dataset)
    if not texts:
        raise ValueError("the corpus is empty")
    order = np.random.default_rng(config.seed).permutation(len(texts))
    n_heldout = min(config.heldout_size, len(texts) // 10)
    encodings = tokenizer.encode_sentences([texts[i] for i in order], config.max_seq_length)
    heldout, train_set = encodings[:n_heldout], encodings[n_heldout:]
    log.info("corpus: %d sentences (%d train, %d held out), %d tokens per sentence on average",
             len(texts), len(train_set), len(heldout), round(np.mean([len(e.input_ids) for e in encodings])))

    specials = special_ids(tokenizer)
    vocab = tokenizer.vocab_size  # random replacements come from the tokenizer's ids, not the encoder's spare rows
    # Held-out masks are drawn once from their own generator: every evaluation (and every run) sees the same targets.
    heldout_gen = torch.Generator().manual_seed(config.seed + 1)
    heldout_batches = _masked_batches(heldout, tokenizer, specials, vocab, heldout_gen, config)

    guidance = AttentionGuidance.from_config(config, tokenizer) if config.ag_weight > 0 else None
    model.to(device).train()
    optimizer = make_optimizer(model, config.lr, config.weight_decay)
    gen = torch.Generator().manual_seed(config.seed)
    order_rng = np.random.default_rng([config.seed, 1])
    permutation, cursor = order_rng.permutation(len(train_set)), 0
    run_log = _RunLog(out_dir / "train_log.jsonl")
    bar = tqdm(total=config.max_steps, disable=not config.progress, desc="pretrain", dynamic_ncols=True)
    try:
        for step in range(config.max_steps):
            step_started = time.perf_counter()
            if cursor + config.batch_size > len(permutation):  # a fresh pass over the corpus
                permutation, cursor = order_rng.permutation(len(train_set)), 0
            ids, mask = _batch([train_set[i] for i in permutation[cursor:cursor + config.batch_size]], tokenizer.pad_id)
            cursor += config.batch_size
            inputs, labels = mask_tokens(ids, mask, specials, tokenizer.mask_id, vocab, gen, config.mask_prob)
            inputs, mask, labels = inputs.to(device), mask.to(device), labels.to(device)
            for group in optimizer.param_groups:
                group["lr"] = group["base_lr"] * lr_factor(step, config.max_steps, config.warmup_ratio)
            mlm, attentions, _ = model(inputs, mask, labels, output_attentions=guidance is not None)
            # AG on the encoder's actual input, the masked sequence (what [Delim]/[Period] can see).
            ag = guidance.attention_loss(attentions, inputs, mask, step / config.max_steps) if guidance else None
            (mlm if ag is None else mlm + ag).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            run_log.step(mlm.item(), None if ag is None else ag.item(), time.perf_counter() - step_started)
            bar.update(1)
            done = step + 1
            if done % config.log_every == 0 or done == config.max_steps:
                run_log.write_window(done, optimizer.param_groups[0]["lr"])
            if heldout_batches and ((config.eval_every and done % config.eval_every == 0) or done == config.max_steps):
                run_log.write_heldout(done, heldout_loss(model, heldout_batches, device))
    finally:
        bar.close()
        run_log.close()

    curves = run_log.curves
    series = {"train MLM": curves["train"], "held-out MLM": curves["heldout"], "AG (x alpha_t)": curves["ag"]}
    line_plot(out_dir / "loss_curve.png", {k: v for k, v in series.items() if v[0]},
              "masked-language-model pre-training", "step", "loss")
    backbone_dir = save_backbone(model, tokenizer, out_dir / "backbone")
    final = curves["heldout"][1][-1] if curves["heldout"][1] else None
    median_ms = run_log.median_step_ms()
    log.info("wrote %s; held-out MLM loss %s; median step %.1f ms", backbone_dir,
             f"{final:.4f}" if final is not None else "n/a (corpus too small to hold sentences out)", median_ms)
    return PretrainResult(backbone_dir, final, curves["train"], curves["heldout"], median_ms)


class _RunLog:
    """train_log.jsonl and the curves: the mean losses of each logging window, held-out evaluations, step times."""

    def __init__(self, path: Path) -> None:
        self.file = open(path, "w", encoding="utf-8")
        self.started = time.perf_counter()
        self.window: dict[str, list[float]] = {"mlm": [], "ag": []}
        self.window_seconds: list[float] = []
        self.all_seconds: list[float] = []
        self.curves: dict[str, tuple[list[int], list[float]]] = {"train": ([], []), "heldout": ([], []), "ag": ([], [])}

    def step(self, mlm: float, ag: float | None, seconds: float) -> None:
        self.window["mlm"].append(mlm)
        if ag is not None:
            self.window["ag"].append(ag)
        self.window_seconds.append(seconds)
        self.all_seconds.append(seconds)

    def _write(self, record: dict) -> None:
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()

    def write_window(self, step: int, lr: float) -> None:
        mlm = float(np.mean(self.window["mlm"]))
        ag = float(np.mean(self.window["ag"])) if self.window["ag"] else None
        self._write({"step": step, "lr": lr, "mlm_loss": mlm, "ag_loss": ag,
                     "elapsed_s": round(time.perf_counter() - self.started, 2),
                     "step_ms": round(1000 * float(np.median(self.window_seconds)), 2)})
        self.curves["train"][0].append(step)
        self.curves["train"][1].append(mlm)
        if ag is not None:
            self.curves["ag"][0].append(step)
            self.curves["ag"][1].append(ag)
        self.window, self.window_seconds = {"mlm": [], "ag": []}, []

    def write_heldout(self, step: int, value: float) -> None:
        self._write({"step": step, "heldout_mlm_loss": value})
        self.curves["heldout"][0].append(step)
        self.curves["heldout"][1].append(value)
        log.info("step %d: held-out MLM loss %.4f", step, value)

    def median_step_ms(self) -> float:
        return 1000 * float(np.median(self.all_seconds)) if self.all_seconds else math.nan

    def close(self) -> None:
        self.file.close()


def _masked_batches(encodings: list, tokenizer: Tokenizer, specials: Tensor, vocab: int, gen: torch.Generator,
                    config: PretrainConfig) -> list[tuple[Tensor, Tensor, Tensor]]:
    batches = []
    for start in range(0, len(encodings), config.batch_size):
        ids, mask = _batch(encodings[start:start + config.batch_size], tokenizer.pad_id)
        inputs, labels = mask_tokens(ids, mask, specials, tokenizer.mask_id, vocab, gen, config.mask_prob)
        batches.append((inputs, mask, labels))
    return batches



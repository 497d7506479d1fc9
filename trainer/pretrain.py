"""Masked-language-model pre-training (``bertzoo pretrain``), optionally with attention guidance (paper 003).

BERT's recipe: in every sequence 15% of the real tokens (not [PAD], [CLS], [SEP], [MASK] or [UNK]) are selected
(BERT's ``max(1, round(0.15 * n))`` per sequence), of which 80% become [MASK], 10% a random token and 10% stay unchanged; the
loss is the cross-entropy on the selected positions only. The MLM head is BERT's (dense + GELU + LayerNorm, decoder tied
to the word embeddings plus a bias) with HuggingFace's names (``cls.predictions.*``), so a BertForMaskedLM checkpoint's
head loads as is.

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
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from tqdm import tqdm

from bertzoo.atomic import atomic_directory, atomic_write_text
from bertzoo.backbone import resolve_backbone
from bertzoo.datafiles import load_split
from bertzoo.tokenization import Tokenizer, pad_batch

from .guidance import AttentionGuidance, check_patterns
from .model import Encoder, EncoderConfig
from .plots import line_plot
from .train import lr_factor, make_optimizer, seed_everything

log = logging.getLogger("bertzoo.pretrain")

IGNORE = -100  # the label of positions without an MLM target (F.cross_entropy's ignore_index)
HEAD_PREFIX = "cls.predictions."


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


# ---------------------------------------------------------------- corpus and masking


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


def special_ids(tokenizer: Tokenizer) -> Tensor:
    return torch.tensor(sorted({tokenizer.pad_id, tokenizer.cls_id, tokenizer.sep_id, tokenizer.mask_id,
                                tokenizer.unk_id}))


def mask_tokens(input_ids: Tensor, attention_mask: Tensor, specials: Tensor, mask_id: int, vocab_size: int,
                generator: torch.Generator, mask_prob: float = 0.15) -> tuple[Tensor, Tensor]:
    """(model input, labels): BERT's masking. ``labels`` holds the original id at selected positions, -100 elsewhere."""
    candidates = attention_mask.bool() & ~torch.isin(input_ids, specials)
    n = candidates.sum(1)
    k = torch.where(n > 0, (n.double() * mask_prob).round().long().clamp(min=1), torch.zeros_like(n))
    # A random rank among each row's candidates; the k lowest ranks are selected.
    scores = torch.rand(input_ids.shape, generator=generator).masked_fill(~candidates, 2.0)
    rank = scores.argsort(1).argsort(1)
    selected = candidates & (rank < k[:, None])
    labels = torch.where(selected, input_ids, torch.full_like(input_ids, IGNORE))
    action = torch.rand(input_ids.shape, generator=generator)
    allowed = torch.ones(vocab_size, dtype=torch.bool)
    allowed[specials] = False
    pool = allowed.nonzero().squeeze(1)  # random replacements are ordinary tokens
    random_ids = pool[torch.randint(len(pool), input_ids.shape, generator=generator)]
    inputs = torch.where(selected & (action < 0.8), torch.full_like(input_ids, mask_id), input_ids)
    inputs = torch.where(selected & (action >= 0.8) & (action < 0.9), random_ids, inputs)
    return inputs, labels


# ---------------------------------------------------------------- model


class _Predictions(nn.Module):
    """BERT's ``cls.predictions``: a transform (dense + GELU + LayerNorm) and the bias of the tied decoder."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.transform = nn.ModuleDict({"dense": nn.Linear(config.hidden_size, config.hidden_size),
                                        "LayerNorm": nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)})
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, states: Tensor, word_embeddings: Tensor) -> Tensor:
        states = self.transform["LayerNorm"](F.gelu(self.transform["dense"](states)))
        return states @ word_embeddings.T + self.bias


class MaskedLM(nn.Module):
    """Encoder + BERT's MLM head; the decoder is the word-embedding matrix itself (tied), so only the transform and
    the bias are the head's own weights. Logits are computed only at the selected positions (15% of the tokens),
    which saves most of the [tokens x vocabulary] product."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.bert = Encoder(config)
        self.cls = nn.ModuleDict({"predictions": _Predictions(config)})
        Encoder._init_weights(self.cls.predictions.transform.dense)

    def head_state(self) -> dict[str, Tensor]:
        return {HEAD_PREFIX + k: v for k, v in self.cls.predictions.state_dict().items()}

    def load_head(self, weights_path: Path) -> bool:
        """Load ``cls.predictions.*`` from a safetensors file if it has them all; False when it has none."""
        state = load_file(str(weights_path))
        state = {k.removeprefix("bert."): v for k, v in state.items()}
        if "cls.predictions.decoder.bias" in state and HEAD_PREFIX + "bias" not in state:
            state[HEAD_PREFIX + "bias"] = state["cls.predictions.decoder.bias"]
        wanted = self.head_state()
        present = [k for k in wanted if k in state]
        if not present:
            return False
        if len(present) < len(wanted) or any(state[k].shape != wanted[k].shape for k in wanted):
            raise ValueError(f"{weights_path}: incomplete or mis-shaped MLM head weights {sorted(present)}")
        self.cls.predictions.load_state_dict({k.removeprefix(HEAD_PREFIX): state[k] for k in wanted})
        return True

    def forward(self, input_ids: Tensor, attention_mask: Tensor, labels: Tensor, output_attentions: bool = False
                ) -> tuple[Tensor, tuple[Tensor, ...] | None, int]:
        """(mean cross-entropy over the selected positions, attention maps, number of selected positions)."""
        encoded = self.bert(input_ids, attention_mask, output_attentions=output_attentions)
        selected = labels != IGNORE
        logits = self.cls["predictions"](encoded.last_hidden_state[selected], self.bert.embeddings.word_embeddings.weight)
        count = int(selected.sum())
        loss = F.cross_entropy(logits.float(), labels[selected], reduction="sum") / max(1, count)
        return loss, encoded.attentions, count


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


# ---------------------------------------------------------------- output


def hf_config(config: EncoderConfig) -> dict:
    """A HuggingFace BertConfig-compatible config.json that EncoderConfig.from_dict reads back exactly (our extra keys,
    such as the attention function, ride along: transformers keeps unknown keys as attributes)."""
    return {"architectures": ["BertForMaskedLM"], "model_type": "bert", "hidden_act": "gelu",
            "position_embedding_type": "absolute", "initializer_range": 0.02, **config.to_dict()}


def save_backbone(model: MaskedLM, tokenizer: Tokenizer, directory: Path) -> Path:
    """Write a backbone directory atomically: built under a temporary name, then renamed into place."""
    # Shareable: a backbone is for others to train from (mkdtemp alone would make it owner-only).
    with atomic_directory(directory, shareable=True) as tmp:
        (tmp / "config.json").write_text(json.dumps(hf_config(model.bert.config), indent=2), encoding="utf-8")
        # Encoder keys as BertModel names them (no prefix, like all-MiniLM-L6-v2) plus the MLM head's.
        tensors = {**model.bert.state_dict(), **model.head_state()}
        save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(tmp / "model.safetensors"))
        (tmp / "tokenizer.json").write_text(tokenizer.to_str(), encoding="utf-8")
    return directory

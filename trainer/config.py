"""Training configuration: one plain dataclass, saved with every checkpoint and logged at start."""

from __future__ import annotations

import json
import types
import typing
from dataclasses import asdict, dataclass, field, fields

from bertzoo.tasks import TASK_NAMES, Limits
from bertzoo.unanswerable import DEFAULT_KIND_CYCLE, NEGATIVE_KINDS, NEGATIVE_STYLES

SAMPLINGS = ("round_robin", "proportional", "annealed", "dynamic")
PRECISIONS = ("auto", "fp32", "bf16")


@dataclass
class TrainConfig:
    preset: str | None = None  # the zoo preset this config started from (bertzoo zoo list); informational
    # data and output
    data_dir: str | None = None  # None: the small samples bundled with bertzoo
    out_dir: str = "runs/default"
    tasks: tuple[str, ...] = TASK_NAMES
    sentiment_dataset: str = "sst5"  # sst5 | cfimdb | sst2
    # SST phrases: a PTB tree file (core/sst_trees.py) whose labelled phrases join the sentiment training sentences
    # (SST-5 only; evaluation stays on sentences). About 150k phrases for SST train; pair with batch_tokens.
    sst_phrases: str | None = None
    limit_per_task: int | None = None  # keep only the first N training examples of each task (and N phrases)
    eval_limit_per_task: int | None = None  # evaluate on the first N dev examples of each task
    # backbone and model
    backbone: str = "default"  # "default" (all-MiniLM-L6-v2, sha256-verified) or a HuggingFace BERT directory
    random_init: bool = False  # build the encoder from the backbone's config with random weights
    encoder_overrides: dict = field(default_factory=dict)  # e.g. {"num_hidden_layers": 2} or {"attention": ...}
    pooling: str = "mean"
    similarity_head: str = "cosine"  # cosine | concat | cross_attention | cross_pool
    # zoo: task-specific heads (trainer/attention_heads.py). Paper 001: self-attention layers on top of the encoder for
    # sentiment, cross-attention layers between the two sentences for paraphrase and similarity. Paper 004:
    # bidirectional cross-attention + attention pooling ("cross_pool"). Paper 000: "ssa" (trainer/ssa.py).
    sentiment_head: str = "linear"  # linear | self_attention | ssa
    paraphrase_head: str = "concat"  # concat | cross_attention | cross_pool
    sentiment_attention_layers: int = 2
    paraphrase_cross_layers: int = 1
    similarity_cross_layers: int = 3
    head_uniform_init: bool = False  # paper 001's U(0.9, 1) initialisation of the attention heads' projections
    similarity_loss: str = "mse"  # mse | neg_pearson (paper 001)
    # sequence limits
    max_seq_length: int = 128
    qa_max_length: int = 384
    qa_doc_stride: int = 128
    # SQuAD 2.0-style training data (any unanswerable question in it) is topped up with synthetic unanswerable
    # questions to this share (core/unanswerable.py). 1/2 is the share in the official v2.0 dev and test sets
    # (train has 1/3): a model trained on fewer abstains too rarely. 0 turns it off.
    qa_unanswerable_fraction: float = 0.5
    # How those synthetic questions relate to their paragraph: "far" (few shared words) or "close" (as many as real
    # SQuAD 2.0 unanswerable questions share); core/unanswerable.py, NEGATIVE_STYLES.
    qa_unanswerable_style: str = "far"
    # The kinds made, in turn (a kind that appears twice is made twice as often): "question" rewritten, the answer's
    # sentence "removed", an "other" paragraph of the article.
    qa_unanswerable_kinds: tuple[str, ...] = DEFAULT_KIND_CYCLE
    # Each real unanswerable training question appears this many times (the synthetic ones once): only the real ones
    # are written the way the dev and test sets' are, and the shared data holds a few hundred of them.
    qa_real_unanswerable_repeat: int = 1
    qa_null_threshold: float = 0.0  # answer "no answer" when null score - best span score exceeds this
    # Articles of the QA training data held out to fit qa_null_threshold at each checkpoint (trainer/calibration.py),
    # for this share of unanswerable questions (None: the held-out articles' own share). 0 articles: keep the value.
    qa_calibration_articles: int = 1
    qa_calibration_share: float | None = 0.5
    # optimisation
    epochs: float = 1.0  # passes over every task's data (times its task weight); the samples: ~1 minute on 2 cores
    max_steps: int | None = None  # overrides epochs when set
    batch_size: int = 16  # per process; pair tasks carry 2x this many sentences
    # Length-grouped batches grown to this many padded tokens per process, never below batch_size (None: fixed
    # batches of random items). Less padding, and short items travel many to a step (trainer/batches.py).
    batch_tokens: int | None = None
    batch_tokens_tasks: tuple = ()  # the tasks batched by batch_tokens (empty: all); the others keep batch_size items
    lr: float = 5e-5
    head_lr: float = 1e-3  # freshly initialised heads learn faster than the pretrained encoder
    lr_layer_decay: float = 1.0  # layer-wise lr decay: each encoder layer at this times the rate of the one above
    weight_decay: float = 0.01
    warmup_ratio: float = 0.1
    grad_clip: float = 1.0
    # Evaluate and save an exponential moving average of the weights over about this share of the run's steps
    # (trainer/averaging.py); 0: the last step's weights
    weight_average: float = 0.0
    sampling: str = "proportional"
    # a task's size for the proportional and annealed samplers and for the epoch length is multiplied by its weight,
    # e.g. {"sentiment": 0.05}: SST phrases in the pool, but the steps of the sentences alone
    task_weights: dict = field(default_factory=dict)
    anneal_min_alpha: float = 0.2  # "annealed": p_task ~ n_task ** alpha, alpha from 1 down to this
    precision: str = "auto"  # auto = bf16 autocast on a GPU that supports it, else fp32
    # The encoder's per-token layers on the real tokens only (trainer/model.py, Packing): the same model, no work spent
    # on padding. False: the padded batch as it is.
    pack_tokens: bool = True
    # zoo: dynamic task prioritization (trainer/prioritization.py; paper 004), used when sampling = "dynamic"
    dtp_every: int = 100  # steps between re-weightings (each one evaluates on dtp_eval_limit dev items per task)
    dtp_eval_limit: int = 200
    # share of the new proposal in each re-weighting (paper 004's alpha), moving linearly to dtp_smoothing_end
    dtp_smoothing_start: float = 0.9
    dtp_smoothing_end: float = 0.5
    dtp_reference: str = "train"  # gap = score on dtp_eval_limit train items - dev score ("train"), or 1 - dev ("target")
    # zoo: attention guidance (trainer/guidance.py; paper 003): an MSE loss pulling chosen heads towards fixed patterns
    ag_weight: float = 0.0  # alpha_0, decayed linearly to 0 over training; 0 turns it off
    ag_fraction: float = 0.5  # share of heads guided in every layer
    ag_patterns: tuple[str, ...] = ("next", "prev", "first")  # one head each, the last pattern fills the rest
    # zoo: self-supervised attention (trainer/ssa.py; paper 000 after Chen et al. 2020)
    ssa_rounds: int = 0  # probe + re-train rounds after the first fine-tuning phase; 0 turns SSA off
    ssa_weight: float = 1.0  # weight of the token-label loss
    ssa_probe_limit: int | None = 2000  # probe at most this many training sentences per round
    ssa_mode: str = "attention"  # attention (SSA layer feeds the head) | classifier (token classifier) | both
    ssa_probe_batch_size: int = 256  # masked sentence variants per probing forward pass
    seed: int = 0
    # bookkeeping
    eval_every_epoch: bool = True
    log_every: int = 10
    keep_checkpoints: int = 2
    # Checkpoints between epochs too (no evaluation), so a killed run loses at most this many steps / minutes.
    save_every: int | None = None
    save_every_minutes: float | None = None
    progress: bool = True

    def __post_init__(self) -> None:
        check_field_types(self)
        self.tasks = tuple(self.tasks)
        self.ag_patterns = tuple(self.ag_patterns)
        self.qa_unanswerable_kinds = tuple(self.qa_unanswerable_kinds)
        unknown = [t for t in self.tasks if t not in TASK_NAMES]
        if unknown or not self.tasks:
            raise ValueError(f"tasks must be a non-empty subset of {TASK_NAMES}, got {list(self.tasks)}")
        if self.sampling not in SAMPLINGS:
            raise ValueError(f"sampling must be one of {SAMPLINGS}, got {self.sampling!r}")
        for task, weight in self.task_weights.items():
            if task not in self.tasks or isinstance(weight, bool) or not isinstance(weight, (int, float)) or weight <= 0:
                raise ValueError(f"task_weights: {task!r}: {weight!r}; give trained tasks ({', '.join(self.tasks)}) "
                                 f"positive numbers")
        if self.task_weights and self.sampling in ("round_robin", "dynamic"):
            raise ValueError(f"task_weights need proportional or annealed sampling, not {self.sampling!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if not 0.0 < self.lr_layer_decay <= 1.0:
            raise ValueError(f"lr_layer_decay must be in (0, 1] (1: off), got {self.lr_layer_decay}")
        if not 0.0 <= self.weight_average <= 1.0:
            raise ValueError(f"weight_average must be in [0, 1] (a share of the run's steps; 0: off), got "
                             f"{self.weight_average}")
        if self.batch_tokens is not None and self.batch_tokens < 1:
            raise ValueError(f"batch_tokens must be >= 1, got {self.batch_tokens}")
        if self.batch_tokens_tasks and (self.batch_tokens is None
                                        or not set(self.batch_tokens_tasks) <= set(self.tasks)):
            raise ValueError(f"batch_tokens_tasks {list(self.batch_tokens_tasks)} needs batch_tokens and trained tasks "
                             f"({', '.join(self.tasks)})")
        if self.sst_phrases is not None and (self.sentiment_dataset != "sst5" or "sentiment" not in self.tasks):
            raise ValueError(f"sst_phrases (--sst-phrases) has SST-5 labels: it needs the sentiment task with "
                             f"sentiment_dataset sst5, not {self.sentiment_dataset!r}")
        if not 0.0 <= self.qa_unanswerable_fraction < 1.0:
            raise ValueError(f"qa_unanswerable_fraction must be in [0, 1), got {self.qa_unanswerable_fraction}")
        if self.qa_unanswerable_style not in NEGATIVE_STYLES:
            raise ValueError(f"qa_unanswerable_style must be one of {NEGATIVE_STYLES}, got {self.qa_unanswerable_style!r}")
        if not self.qa_unanswerable_kinds or set(self.qa_unanswerable_kinds) - set(NEGATIVE_KINDS):
            raise ValueError(f"qa_unanswerable_kinds must be some of {NEGATIVE_KINDS}, got "
                             f"{list(self.qa_unanswerable_kinds)}")
        if self.qa_real_unanswerable_repeat < 1:
            raise ValueError(f"qa_real_unanswerable_repeat must be >= 1, got {self.qa_real_unanswerable_repeat}")
        if self.qa_calibration_articles < 0:
            raise ValueError(f"qa_calibration_articles must be >= 0, got {self.qa_calibration_articles}")
        if self.qa_calibration_share is not None and not 0.0 < self.qa_calibration_share < 1.0:
            raise ValueError(f"qa_calibration_share must be in (0, 1), got {self.qa_calibration_share}")
        if self.similarity_loss not in ("mse", "neg_pearson"):
            raise ValueError(f"similarity_loss must be 'mse' or 'neg_pearson', got {self.similarity_loss!r}")
        if not 0.0 <= self.ag_fraction <= 1.0:
            raise ValueError(f"ag_fraction must be in [0, 1], got {self.ag_fraction}")
        if self.ssa_rounds < 0:
            raise ValueError(f"ssa_rounds must be >= 0, got {self.ssa_rounds}")
        if self.ssa_mode not in ("attention", "classifier", "both"):
            raise ValueError(f"ssa_mode must be 'attention', 'classifier' or 'both', got {self.ssa_mode!r}")
        if self.ssa_probe_batch_size < 1:
            raise ValueError(f"ssa_probe_batch_size must be >= 1, got {self.ssa_probe_batch_size}")
        if self.dtp_reference not in ("train", "target"):
            raise ValueError(f"dtp_reference must be 'train' or 'target', got {self.dtp_reference!r}")
        if self.dtp_every < 1 or self.dtp_eval_limit < 1:
            raise ValueError(f"dtp_every and dtp_eval_limit must be >= 1, got {self.dtp_every}, {self.dtp_eval_limit}")
        if (self.save_every is not None and self.save_every < 1) or (
                self.save_every_minutes is not None and self.save_every_minutes <= 0):
            raise ValueError(f"save_every must be >= 1 and save_every_minutes > 0, got {self.save_every}, "
                             f"{self.save_every_minutes}")
        if self.qa_doc_stride >= self.qa_max_length:
            raise ValueError(f"qa_doc_stride {self.qa_doc_stride} must be below qa_max_length {self.qa_max_length}")
        from .model import EncoderConfig  # torch; imported here so reading a config needs none

        # Unknown keys and bad values (attention=foo) fail now rather than after the run directory is written.
        try:
            EncoderConfig.from_dict({}, **self.encoder_overrides)
        except (TypeError, ValueError) as e:
            raise ValueError(f"encoder_overrides (--encoder): {e}") from e

    @property
    def limits(self) -> Limits:
        return Limits(self.max_seq_length, self.qa_max_length, self.qa_doc_stride)

    def batch_tokens_of(self, task: str) -> int | None:
        """The token budget of ``task``'s length-grouped batches, None for fixed batches of batch_size."""
        return self.batch_tokens if not self.batch_tokens_tasks or task in self.batch_tokens_tasks else None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> TrainConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown training config keys {unknown}")
        return cls(**d)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)


_TYPE_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string", tuple: "a list",
               dict: "a JSON object"}


def check_field_types(config) -> None:
    """Refuse a field whose value has the wrong type (``--set lr=abc``, a preset's ``epochs = "3"``), naming it.

    Values come from JSON and TOML, so an int is accepted where a float is expected (and stored as a float) and a
    list where a tuple is.
    """
    for name, hint in typing.get_type_hints(type(config)).items():
        value = getattr(config, name)
        allowed = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
        if value is None and type(None) in allowed:
            continue
        expected = next(typing.get_origin(t) or t for t in allowed if t is not type(None))
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            setattr(config, name, float(value))
        elif expected is tuple and isinstance(value, list):
            setattr(config, name, tuple(value))
        elif not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
            raise ValueError(f"{name} must be {_TYPE_NAMES.get(expected, expected.__name__)}, got {value!r}")

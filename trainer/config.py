"""Training configuration: one plain dataclass, saved with every checkpoint and logged at start."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields

from bertzoo.tasks import TASK_NAMES, Limits

SAMPLINGS = ("round_robin", "proportional", "annealed")
PRECISIONS = ("auto", "fp32", "bf16")


@dataclass
class TrainConfig:
    # data and output
    data_dir: str | None = None  # None: the small samples bundled with bertzoo
    out_dir: str = "runs/default"
    tasks: tuple[str, ...] = TASK_NAMES
    sentiment_dataset: str = "sst5"  # sst5 | cfimdb | sst2
    limit_per_task: int | None = None  # keep only the first N training examples of each task (quick runs)
    eval_limit_per_task: int | None = None  # evaluate on the first N dev examples of each task
    # backbone and model
    backbone: str = "default"  # "default" (all-MiniLM-L6-v2, sha256-verified) or a HuggingFace BERT directory
    random_init: bool = False  # build the encoder from the backbone's config with random weights
    encoder_overrides: dict = field(default_factory=dict)  # e.g. {"num_hidden_layers": 2} or {"attention": ...}
    pooling: str = "mean"
    similarity_head: str = "cosine"
    # sequence limits
    max_seq_length: int = 128
    qa_max_length: int = 384
    qa_doc_stride: int = 128
    # SQuAD 2.0-style training data (any unanswerable question in it) is topped up with synthetic unanswerable
    # questions to this share (bertzoo/unanswerable.py); 1/3 is the official v2.0 train share. 0 turns it off.
    qa_unanswerable_fraction: float = 1 / 3
    qa_null_threshold: float = 0.0  # answer "no answer" when null score - best span score exceeds this
    # optimisation
    epochs: float = 3.0
    max_steps: int | None = None  # overrides epochs when set
    batch_size: int = 16  # per process; pair tasks carry 2x this many sentences
    lr: float = 5e-5
    head_lr: float = 1e-3  # freshly initialised heads learn faster than the pretrained encoder
    weight_decay: float = 0.01
    warmup_ratio: float = 0.1
    grad_clip: float = 1.0
    sampling: str = "proportional"
    anneal_min_alpha: float = 0.2  # "annealed": p_task ~ n_task ** alpha, alpha from 1 down to this
    precision: str = "auto"  # auto = bf16 autocast on a GPU that supports it, else fp32
    seed: int = 0
    # bookkeeping
    eval_every_epoch: bool = True
    log_every: int = 10
    keep_checkpoints: int = 2
    progress: bool = True

    def __post_init__(self) -> None:
        self.tasks = tuple(self.tasks)
        unknown = [t for t in self.tasks if t not in TASK_NAMES]
        if unknown or not self.tasks:
            raise ValueError(f"tasks must be a non-empty subset of {TASK_NAMES}, got {list(self.tasks)}")
        if self.sampling not in SAMPLINGS:
            raise ValueError(f"sampling must be one of {SAMPLINGS}, got {self.sampling!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if not 0.0 <= self.qa_unanswerable_fraction < 1.0:
            raise ValueError(f"qa_unanswerable_fraction must be in [0, 1), got {self.qa_unanswerable_fraction}")
        if self.qa_doc_stride >= self.qa_max_length:
            raise ValueError(f"qa_doc_stride {self.qa_doc_stride} must be below qa_max_length {self.qa_max_length}")

    @property
    def limits(self) -> Limits:
        return Limits(self.max_seq_length, self.qa_max_length, self.qa_doc_stride)

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

"""The PyTorch backend: the reference model (trainer/) in fp32, or its encoder in fp16 / bf16, on the CPU or a CUDA GPU,
optionally replayed as CUDA graphs. torch is imported when one is made (:func:`create`, its entry in
``serving.backends.BACKENDS``), so the torch-free install imports this module too."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from bertzoo.pipeline import PAIR_TASKS

from .base import EMBED, BackendUnavailable, row_index, rows_mask

if TYPE_CHECKING:
    import torch

    from bertzoo.trainer.heads import MultitaskModel

PRECISIONS = ("fp32", "fp16", "bf16")
INSTALL_HINT = ("pip install 'bertzoo[train]', or serve an export artifact with the onnxruntime backend, which needs no "
                "torch")


class TorchBackend:
    """The PyTorch reference backend: numpy in, numpy out, as ``bertzoo.pipeline.Backend`` asks.

    ``precision`` fp16 / bf16 casts the encoder's weights to that type (so use it on a model of its own, as the
    server does); the heads are small and stay float32, fed the encoder's states as float32, as on every engine.
    ``cuda_graphs`` replays the encoder as captured CUDA graphs (trainer/cuda_graphs.py), for a model on a GPU; a batch
    of one task then runs the encoder and that task's head as one graph (:meth:`run_task`). A graph holds
    ``graph_rows`` rows, rounded up to a power of two (the server passes its largest batch); larger batches run
    eagerly.
    ``resident_states`` (default: on cuda) keeps the encoder's states on the device for the heads
    (:meth:`encode_resident`): the host path copies batch x length x hidden floats to the host, cuts and masks them
    there with numpy, and copies them back for the heads.
    """

    def __init__(self, model: MultitaskModel, device: torch.device | None = None, precision: str = "fp32",
                 cuda_graphs: bool = False, resident_states: bool | None = None, graph_rows: int = 64) -> None:
        import torch

        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
        self._torch = torch
        self.model = model
        self.device = device or next(model.parameters()).device
        self.precision = precision
        self.dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[precision]
        if self.dtype != torch.float32:
            model.encoder.to(self.dtype)
        self.graphs = None
        if cuda_graphs:
            if self.device.type != "cuda":
                raise ValueError(f"CUDA graphs need a model on a CUDA device, this one is on {self.device}")
            from bertzoo.trainer.cuda_graphs import GraphedEncoder, padded_rows

            model.eval()
            self.graphs = GraphedEncoder(self._encode_tensors, self.device, max_rows=padded_rows(graph_rows))
        self.resident_states = self.device.type == "cuda" if resident_states is None else resident_states
        self.graph_heads = True  # off: the heads run after the encoder's graph (gpu_check compares the two)

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        return self._torch.from_numpy(np.ascontiguousarray(array)).to(self.device)

    def _encode_tensors(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        with self._torch.no_grad():
            return self.model.encode(inputs)

    def _eval_mode(self) -> None:
        """The model in eval mode (no dropout), whoever switched it to training since (the trainer evaluates through
        a backend on its live model). Only when it is not already: ``eval()`` walks every submodule, 0.3 ms of host
        time on a 2-core VM, which a GPU's batch would pay twice (encoder and head) while the device waits."""
        if self.model.training:
            self.model.eval()

    def _states(self, batch: dict[str, np.ndarray]) -> torch.Tensor:
        """The encoder's states on the device, in the encoder's dtype."""
        self._eval_mode()
        with self._torch.no_grad():
            if self.graphs is not None and (states := self.graphs.encode_tensor(batch)) is not None:
                return states
            return self._encode_tensors({k: self._tensor(v) for k, v in batch.items()})

    def encode(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        return self._states(batch).float().cpu().numpy()

    def encode_resident(self, batch: dict[str, np.ndarray]) -> TorchStates:
        """:meth:`encode`, with the states left on the device."""
        return TorchStates(self, self._states(batch), batch["attention_mask"])

    @property
    def runs_tasks(self) -> bool:
        """Whether :meth:`run_task` may run a one-task batch: CUDA graphs, with the heads in them."""
        return self.graphs is not None and self.graph_heads

    def run_task(self, task: str, batch: dict[str, np.ndarray], pooling: str) -> tuple[np.ndarray, ...] | None:
        """The outputs of ``task``'s head over every row of a batch of that task alone, the encoder and the head
        replayed as one CUDA graph: what ``serving.engine.run_batch`` would get from :meth:`encode_resident` and
        :meth:`head` (one per pair for the pair tasks; the states' full width, where the heads mask what
        ``TorchStates.select`` would have cut). None where no graph runs it (no graphs, heads left out of them, more
        rows than a graph holds): the caller takes the usual path."""
        if not self.runs_tasks:
            return None
        self._eval_mode()
        pairs = task in PAIR_TASKS
        with self._torch.no_grad():
            return self.graphs.run(batch, (task, pooling), lambda inputs: self._encode_and_head(task, pooling, inputs),
                                   (lambda rows: rows // 2) if pairs else (lambda rows: rows))

    def _encode_and_head(self, task: str, pooling: str, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """What :meth:`run_task` captures: the encoder, its states zero past each sequence's end (as
        ``TorchStates.select`` gives them), then the task's head, or the pooled unit vectors for Embed."""
        mask = inputs["attention_mask"]
        states = self.model.encode(inputs).float() * mask[..., None]  # the heads take float32
        if task == EMBED:
            return (unit_embeddings(states, mask, pooling),)
        if task in PAIR_TASKS:  # a pair's two sentences are consecutive rows
            out = self.model.heads[task](states_a=states[0::2], mask_a=mask[0::2], states_b=states[1::2],
                                         mask_b=mask[1::2])
        else:
            out = self.model.heads[task](states=states, mask=mask)
        return out if isinstance(out, tuple) else (out,)

    def head(self, task: str, inputs: dict[str, np.ndarray | torch.Tensor]) -> tuple[np.ndarray, ...]:
        self._eval_mode()
        with self._torch.no_grad():
            # By name: the heads' forward parameters are the graph input names (states, mask, states_a, ...).
            out = self.model.heads[task](**{k: v if isinstance(v, self._torch.Tensor) else self._tensor(v)
                                            for k, v in inputs.items()})
        return tuple(o.float().cpu().numpy() for o in (out if isinstance(out, tuple) else (out,)))


class TorchStates:
    """The encoder's states of one batch as a tensor on the backend's device: ``select`` cuts and masks a task's rows
    there (as ``engine.HostStates`` does on the host) for its head, ``host`` copies rows back only where the host
    needs them (embeddings).

    The batch's attention mask goes to the device once, for every task's rows; a task's rows that are consecutive (a
    batch of one task: all of it) are a view of the states, not a gather. Each copy from the host and each kernel is
    host time a GPU's batch waits through."""

    def __init__(self, backend: TorchBackend, states: torch.Tensor, mask: np.ndarray) -> None:
        self._backend, self._states, self.mask = backend, states, mask
        self._device_mask: torch.Tensor | None = None

    def select(self, rows) -> tuple[torch.Tensor, torch.Tensor]:
        """States (float32, zero past each sequence's end) and attention mask of ``rows``, on the device, cut to the
        longest of them."""
        width = rows_mask(self.mask, rows).shape[1]  # from the host's copy: no wait for the device
        if self._device_mask is None:
            self._device_mask = self._backend._tensor(self.mask)
        index = row_index(rows)
        if isinstance(index, slice):
            states, mask = self._states[index, :width], self._device_mask[index, :width]
        else:
            torch, device = self._backend._torch, self._states.device
            gather = torch.as_tensor(rows, dtype=torch.int64).to(device, non_blocking=True)
            states = self._states.index_select(0, gather)[:, :width]
            mask = self._device_mask.index_select(0, gather)[:, :width]
        return states.float() * mask[..., None], mask  # the heads take float32

    def host(self, rows) -> tuple[np.ndarray, np.ndarray]:
        selected, _ = self.select(rows)
        return selected.cpu().numpy(), rows_mask(self.mask, rows)

    def embeddings(self, rows, pooling: str) -> np.ndarray:
        """Sentence embeddings pooled on the device (as ``base.pool_embeddings`` pools on the host): only
        rows x hidden floats come back, not the rows' states."""
        return unit_embeddings(*self.select(rows), pooling).cpu().numpy()  # the states are zero past each end


def unit_embeddings(states: torch.Tensor, mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """Sentence embeddings of states zero past each sequence's end, pooled and L2-normalised on the device, as
    ``base.pool_embeddings`` does on the host."""
    if pooling == "cls":
        pooled = states[:, 0]
    else:
        pooled = states.sum(dim=1) / mask.sum(dim=1, keepdim=True).to(states.dtype).clamp(min=1.0)
    return pooled / pooled.norm(dim=-1, keepdim=True).clamp(min=1e-12)


def create(source: MultitaskModel, *, device: str | torch.device | None = None, precision: str = "fp32",
           cuda_graphs: bool = False, resident_states: bool | None = None, graph_rows: int = 64,
           **_) -> TorchBackend:
    """The backend's factory in the registry: ``source`` is the model itself; ``device`` None: where the model is."""
    if isinstance(device, str):  # "cpu", "cuda"
        import torch

        device = torch.device(device)
    return TorchBackend(source, device, precision=precision, cuda_graphs=cuda_graphs, resident_states=resident_states,
                        graph_rows=graph_rows)


def check(device: str) -> None:
    """On cuda, a torch that sees a GPU (torch itself is checked by the registry's import of it)."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise BackendUnavailable(f"--device cuda: torch {torch.__version__} sees no CUDA GPU; install a CUDA build of "
                                 "torch on a machine with an NVIDIA driver")

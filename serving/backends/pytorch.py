"""The PyTorch backend: the reference model (trainer/) in fp32, or its encoder in fp16 / bf16, on the CPU or a CUDA GPU,
optionally replayed as CUDA graphs. torch is imported when one is made (:func:`create`, its entry in
``serving.backends.BACKENDS``), so the torch-free install imports this module too."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .base import BackendUnavailable, row_index, rows_mask

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
    ``cuda_graphs`` replays the encoder as captured CUDA graphs (trainer/cuda_graphs.py), for a model on a GPU.
    ``resident_states`` (default: on cuda) keeps the encoder's states on the device for the heads
    (:meth:`encode_resident`): the host path copies batch x length x hidden floats to the host, cuts and masks them
    there with numpy, and copies them back for the heads.
    """

    def __init__(self, model: MultitaskModel, device: torch.device | None = None, precision: str = "fp32",
                 cuda_graphs: bool = False, resident_states: bool | None = None) -> None:
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
            from bertzoo.trainer.cuda_graphs import GraphedEncoder

            model.eval()
            self.graphs = GraphedEncoder(self._encode_tensors, self.device)
        self.resident_states = self.device.type == "cuda" if resident_states is None else resident_states

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
        states, mask = self.select(rows)  # zero past each sequence's end
        if pooling == "cls":
            pooled = states[:, 0]
        else:
            pooled = states.sum(dim=1) / mask.sum(dim=1, keepdim=True).to(states.dtype).clamp(min=1.0)
        return (pooled / pooled.norm(dim=-1, keepdim=True).clamp(min=1e-12)).cpu().numpy()


def create(source: MultitaskModel, *, device: str | torch.device | None = None, precision: str = "fp32",
           cuda_graphs: bool = False, resident_states: bool | None = None, **_) -> TorchBackend:
    """The backend's factory in the registry: ``source`` is the model itself; ``device`` None: where the model is."""
    if isinstance(device, str):  # "cpu", "cuda"
        import torch

        device = torch.device(device)
    return TorchBackend(source, device, precision=precision, cuda_graphs=cuda_graphs, resident_states=resident_states)


def check(device: str) -> None:
    """On cuda, a torch that sees a GPU (torch itself is checked by the registry's import of it)."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise BackendUnavailable(f"--device cuda: torch {torch.__version__} sees no CUDA GPU; install a CUDA build of "
                                 "torch on a machine with an NVIDIA driver")

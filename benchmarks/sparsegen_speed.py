"""sparsegen-lin against softmax, side by side in one run: the probability function alone (forward + backward), the
whole MiniLM-sized encoder forward, and a training step (the encoder's forward and backward, dropout on) with SSAF's
bisection eager and as the native CPU kernel (trainer/sparsegen_cpu.cc), as ratios to softmax.
``python benchmarks/sparsegen_speed.py [--steps-only] [--rounds N] [--profile]``"""

from __future__ import annotations

import argparse
import statistics
import time
from unittest import mock

import torch
from timing import machine, median_ms  # benchmarks/timing.py

from bertzoo.trainer import sparsegen_native
from bertzoo.trainer.model import Encoder, EncoderConfig
from bertzoo.trainer.sparsegen import masked_softmax, sparsegen_lin


def probability_functions(b: int, t: int) -> None:
    scores = torch.randn(b, 12, t, t) * 3
    mask = torch.ones(b, 1, 1, t, dtype=torch.bool)
    mask[: b // 2, ..., t * 3 // 4:] = False

    def fwd_bwd(fn):
        def run():
            x = scores.clone().requires_grad_(True)
            fn(x).sum().backward()
        return run

    results = {
        "softmax": median_ms(fwd_bwd(lambda x: masked_softmax(x, mask))),
        "sparsegen sort": median_ms(fwd_bwd(lambda x: sparsegen_lin(x, mask, -3.0, "sort"))),
        "sparsegen bisect": median_ms(fwd_bwd(lambda x: sparsegen_lin(x, mask, -3.0, "bisect"))),
    }
    base = results["softmax"]
    for name, ms in results.items():
        print(f"probs fwd+bwd b{b}/s{t}  {name:<18} {ms:8.2f} ms  x{ms / base:5.2f}")


@torch.no_grad()
def encoders(b: int, t: int) -> None:
    ids = torch.randint(1000, 30000, (b, t))
    mask = torch.ones(b, t, dtype=torch.long)
    results = {}
    for name, overrides in {
        "softmax (fused sdpa)": {},
        "sparsegen sort": {"attention": "sparsegen_lin", "sparsegen_lambda": -3.0, "sparsegen_impl": "sort"},
        "sparsegen bisect": {"attention": "sparsegen_lin", "sparsegen_lambda": -3.0, "sparsegen_impl": "bisect"},
    }.items():
        torch.manual_seed(0)
        encoder = Encoder(EncoderConfig(**overrides)).eval()
        results[name] = median_ms(lambda encoder=encoder: encoder(ids, mask), repeats=9)
    base = results["softmax (fused sdpa)"]
    for name, ms in results.items():
        print(f"MiniLM encoder fwd b{b}/s{t}  {name:<20} {ms:8.2f} ms  x{ms / base:5.2f}")


# PyTorch's SDPA, which on the CPU runs its math path (probabilities materialized, as SSAF's) when dropout is on.
SOFTMAX_TRAINING = "softmax (sdpa, math path)"
SSAF = {"attention": "sparsegen_lin", "sparsegen_lambda": -3.0, "sparsegen_impl": "bisect"}


def padded_batch(b: int, t: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random token ids and an attention mask with a quarter of the keys padded in half the rows, as in real batches."""
    ids = torch.randint(1000, 30000, (b, t))
    mask = torch.ones(b, t, dtype=torch.long)
    mask[: b // 2, t * 3 // 4:] = 0
    return ids, mask


def training_steps(b: int, t: int, rounds: int = 15) -> None:
    """One training step (forward + backward, dropout on) per variant per round, the variants interleaved; the ratio
    to softmax is taken within each round, then its median and range are reported."""
    ids, mask = padded_batch(b, t)
    variants = {SOFTMAX_TRAINING: ({}, True), "SSAF bisect, eager": (SSAF, False),
                "SSAF bisect, native kernel": (SSAF, True)}
    encoders = {}
    for name, (overrides, _) in variants.items():
        torch.manual_seed(0)
        encoders[name] = Encoder(EncoderConfig(**overrides)).train()

    def step(name: str) -> float:
        encoder, native = encoders[name], variants[name][1]
        with mock.patch.object(sparsegen_native, "forward", sparsegen_native.forward if native else _none), \
                mock.patch.object(sparsegen_native, "backward", sparsegen_native.backward if native else _none):
            started = time.perf_counter()
            encoder(ids, mask).last_hidden_state.pow(2).mean().backward()
            elapsed = time.perf_counter() - started
        encoder.zero_grad(set_to_none=True)
        return elapsed * 1000

    for name in variants:  # warm-up (and the kernel's build, once)
        step(name), step(name)
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name in variants:
            times[name].append(step(name))
    base = times[SOFTMAX_TRAINING]
    for name, ms in times.items():
        ratios = [m / s for m, s in zip(ms, base, strict=True)]
        print(f"train step b{b}/s{t}  {name:<28} {statistics.median(ms):8.1f} ms  x{statistics.median(ratios):5.2f} "
              f"(rounds: {min(ratios):.2f}-{max(ratios):.2f})")


def profile_steps(b: int, t: int, steps: int = 4) -> None:
    """Where a training step's time goes, softmax against SSAF (native kernel): torch.profiler's self time per op,
    per step, the ops that differ most first."""
    ids, mask = padded_batch(b, t)
    per_op: dict[str, dict[str, float]] = {}
    for name, overrides in (("softmax", {}), ("SSAF", SSAF)):
        torch.manual_seed(0)
        encoder = Encoder(EncoderConfig(**overrides)).train()
        for _ in range(2):
            encoder(ids, mask).last_hidden_state.pow(2).mean().backward()
        with torch.profiler.profile() as profiler:
            for _ in range(steps):
                encoder(ids, mask).last_hidden_state.pow(2).mean().backward()
        per_op[name] = {e.key: e.self_cpu_time_total / 1000 / steps for e in profiler.key_averages()}
    soft, ssaf = per_op["softmax"], per_op["SSAF"]
    print(f"profile b{b}/s{t}, ms per step: softmax {sum(soft.values()):.1f}, SSAF {sum(ssaf.values()):.1f}")
    for op in sorted(set(soft) | set(ssaf), key=lambda k: -abs(ssaf.get(k, 0) - soft.get(k, 0)))[:12]:
        print(f"  {op[:52]:<52} softmax {soft.get(op, 0):7.1f}  SSAF {ssaf.get(op, 0):7.1f}")


def _none(*_args):
    return None


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps-only", action="store_true", help="only the training steps")
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds of training steps per shape")
    parser.add_argument("--profile", action="store_true", help="only a per-op profile of the b8/s128 step")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {machine()}; native kernel: "
          f"{sparsegen_native.available() or sparsegen_native.unavailable_reason()}")
    if args.profile:
        profile_steps(8, 128)
        raise SystemExit(0)
    for b, t in ((16, 64), (8, 128)):
        training_steps(b, t, args.rounds)
    if not args.steps_only:
        for b, t in ((8, 128), (32, 64)):
            probability_functions(b, t)
        encoders(8, 128)

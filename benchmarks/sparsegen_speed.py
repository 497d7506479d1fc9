"""sparsegen-lin against softmax, side by side in one run: the probability function alone (forward + backward) and
the whole MiniLM-sized encoder forward, as ratios to softmax. ``python benchmarks/sparsegen_speed.py``"""

from __future__ import annotations

import torch
from timing import median_ms  # benchmarks/timing.py

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


if __name__ == "__main__":
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    for b, t in ((8, 128), (32, 64)):
        probability_functions(b, t)
    encoders(8, 128)

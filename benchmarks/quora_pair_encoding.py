"""Quora alone: the pair encoded sentence by sentence (bertzoo's paraphrase head, [u; v; |u - v|] of mean-pooled
states) against both sentences in one pass ([CLS] a [SEP] b [SEP], mean-pooled, a cross-encoder), same backbone,
steps, batch, rates and schedule. A probe for whether a cross-encoder is a lever for the Quora goal (RESULTS.md).

    python benchmarks/quora_pair_encoding.py {bi,cross} STEPS SEED --data DATA [--dev-pairs 4000]
"""

from __future__ import annotations

import argparse
import random
import time

import torch
from torch import nn

from bertzoo.backbone import resolve_backbone
from bertzoo.data import read_cs224n_pairs
from bertzoo.tokenization import pad_batch
from bertzoo.trainer.model import Encoder, EncoderConfig
from bertzoo.trainer.model_config import pool


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("bi", "cross"))
    ap.add_argument("steps", type=int)
    ap.add_argument("seed", type=int)
    ap.add_argument("--data", required=True, help="the shared data folder (quora/quora-train-subset.csv, quora-dev.csv)")
    ap.add_argument("--dev-pairs", type=int, default=4000, help="a fixed random sample of the dev pairs")
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    backbone = resolve_backbone(None)
    tokenizer = backbone.tokenizer()
    train = read_cs224n_pairs(f"{args.data}/quora/quora-train-subset.csv", "is_duplicate")
    dev = read_cs224n_pairs(f"{args.data}/quora-dev.csv", "is_duplicate")
    random.Random(1).shuffle(dev)
    dev = dev[: args.dev_pairs]
    encoder = Encoder(EncoderConfig.from_dict(backbone.config()))
    encoder.load_pretrained(backbone.weights_path)
    hidden = encoder.config.hidden_size
    head = nn.Linear(3 * hidden if args.mode == "bi" else hidden, 1)
    optimizer = torch.optim.AdamW([{"params": encoder.parameters(), "lr": 1e-4},
                                   {"params": head.parameters(), "lr": 1e-3}], weight_decay=0.01)
    warmup = 0.1 * args.steps  # bertzoo train's schedule: 10% linear warm-up, then linear decay to 0
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min((s + 1) / warmup, max(0.0, (args.steps - s) / (args.steps - warmup))))

    def logits(examples: list) -> torch.Tensor:
        a, b = [e.text_a for e in examples], [e.text_b for e in examples]
        if args.mode == "bi":
            batch = pad_batch(tokenizer.encode_sentences(a + b, 128), tokenizer.pad_id)
        else:
            batch = pad_batch(tokenizer.encode_pairs(a, b, 256), tokenizer.pad_id)
        t = {k: torch.from_numpy(v) for k, v in batch.items()}
        states = encoder(t["input_ids"], t["attention_mask"], t["token_type_ids"]).last_hidden_state
        mask = t["attention_mask"]
        if args.mode == "cross":
            return head(pool(states, mask, "mean")).squeeze(-1)
        n = len(examples)
        u, v = pool(states[:n], mask[:n], "mean"), pool(states[n:], mask[n:], "mean")
        return head(torch.cat([u, v, (u - v).abs()], -1)).squeeze(-1)

    start, order = time.time(), []
    for step in range(args.steps):
        if len(order) < 16:
            order += rng.sample(range(len(train)), len(train))
        examples = [train[i] for i in order[:16]]
        del order[:16]
        loss = nn.functional.binary_cross_entropy_with_logits(
            logits(examples), torch.tensor([float(e.label) for e in examples]))
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(encoder.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if step % 200 == 0:
            print(f"step {step}: loss {loss.item():.3f}, {time.time() - start:.0f} s", flush=True)
    encoder.eval()
    head.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(dev), 64):
            examples = dev[i:i + 64]
            predicted = (logits(examples) > 0).tolist()
            correct += sum(int(p) == int(e.label) for p, e in zip(predicted, examples, strict=True))
    print(f"mode={args.mode} steps={args.steps} seed={args.seed} dev accuracy on {len(dev)} pairs: "
          f"{correct / len(dev):.4f} ({time.time() - start:.0f} s)")


if __name__ == "__main__":
    main()

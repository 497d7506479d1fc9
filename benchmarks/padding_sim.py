"""How much of the encoder's work is padding under the server's batching, simulated on real sentence lengths.

    python benchmarks/padding_sim.py ARTIFACT --data ../shared/data/ids-sst-dev.csv

A closed loop of 64 clients, one sentence per request; each batch takes the oldest waiting item's group (up to 64
items) and pads to its longest row rounded up to 8; a batch costs ``overhead + per_token x padded tokens`` (per_token
set so that the in-process ceiling, which sorts every sentence by length, matches a measured rate). Prints the padding
efficiency (real / padded tokens) and predicted sentences/s for the export's length buckets and for groups 8 tokens
wide (what the server uses now), against the ceiling. A model of the batcher, not a measurement of the server.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import numpy as np

from bertzoo.artifact import load_manifest
from bertzoo.serving.engine import padded_width
from bertzoo.serving.load import load_items
from bertzoo.tokenization import Tokenizer


def simulate(lengths: np.ndarray, group, overhead_ms: float, per_token_ms: float, clients: int = 64,
             batches: int = 3000, seed: int = 0) -> tuple[float, float]:
    rng = random.Random(seed)
    waiting = [(i, rng.randrange(len(lengths))) for i in range(clients)]
    arrivals, elapsed, done, real, padded = clients, 0.0, 0, 0, 0
    for _ in range(batches):
        oldest = min(waiting)
        key = group(lengths[oldest[1]])
        batch = [w for w in sorted(waiting) if group(lengths[w[1]]) == key][:64]
        waiting = [w for w in waiting if w not in batch]
        rows = [lengths[s] for _, s in batch]
        width = padded_width(max(rows))
        real, padded, done = real + sum(rows), padded + width * len(rows), done + len(rows)
        elapsed += overhead_ms + per_token_ms * width * len(rows)
        waiting += [(arrivals + k, rng.randrange(len(lengths))) for k in range(len(batch))]
        arrivals += len(batch)
    return done / elapsed * 1000, real / padded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact")
    parser.add_argument("--data", required=True)
    parser.add_argument("--ceiling", type=float, default=258.0, help="measured in-process sentences/s to calibrate to")
    parser.add_argument("--overhead-ms", type=float, default=3.0, help="fixed cost of one encoder batch")
    args = parser.parse_args()
    manifest = load_manifest(args.artifact)
    tokenizer = Tokenizer.from_file(Path(args.artifact) / manifest["tokenizer"])
    texts = load_items("sentiment", args.data)
    lengths = np.array([len(e.input_ids) for e in tokenizer.encode_sentences(texts, manifest["limits"]["max_seq_length"])])
    order = np.sort(lengths)
    chunks = [order[i:i + 64] for i in range(0, len(order), 64)]
    ceiling_tokens = sum(int(c.max()) * len(c) for c in chunks)
    per_token = (len(lengths) / args.ceiling * 1000 - args.overhead_ms * len(chunks)) / ceiling_tokens
    print(f"{len(lengths)} sentences, mean {lengths.mean():.1f} tokens; ceiling (length-sorted batches of 64): "
          f"padding efficiency {lengths.sum() / ceiling_tokens:.2f}, {args.ceiling:.0f} sentences/s")
    buckets = manifest["length_buckets"]
    for name, group in (("export length buckets " + "/".join(map(str, buckets)),
                         lambda n: next((b for b in buckets if n <= b), n)),
                        ("padded-width groups (8 tokens)", padded_width)):
        rate, efficiency = simulate(lengths, group, args.overhead_ms, per_token)
        print(f"- {name}: padding efficiency {efficiency:.2f}, {rate:.0f} sentences/s = {rate / args.ceiling:.2f} "
              "of the ceiling")


if __name__ == "__main__":
    main()

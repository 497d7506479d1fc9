"""What the load balancer adds: the same replica called directly and through nginx (deploy/compose/nginx.conf, run by
deploy/local.py), same load, alternating in one run.

    python benchmarks/balancer_latency.py ARTIFACT [--seconds 15] [--data ../shared/data/ids-sst-dev.csv]

One replica (so both paths reach the same server), closed-loop clients sending one sentence per Sentiment request
(`bertzoo.serving.load`), at 1 client (the hop's own latency) and at 8 (the server busy); each measured twice, direct
and through nginx alternating, to cancel drift. Needs nginx on PATH (Debian: apt-get install nginx).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
from timing import machine

from bertzoo.serving.load import load_items, run_load

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "deploy"))
import local  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact")
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--data", help="SST sentences (default: the bundled dev sample)")
    parser.add_argument("--out")
    args = parser.parse_args()
    if missing := local.missing_tools(prometheus=False):
        sys.exit(f"needs {' and '.join(missing)} on PATH")
    sentences = load_items("sentiment", args.data)
    results: dict = {**machine(), "seconds": args.seconds, "runs": []}
    with tempfile.TemporaryDirectory() as workdir, \
            local.LocalStack(args.artifact, workdir, replicas=1, prometheus=False) as stack:
        paths = {"direct": stack.replica_target(0), "nginx": stack.target}
        asyncio.run(run_load(paths["nginx"], "sentiment", sentences, concurrency=8, duration=3))  # warm both hops
        for clients in (1, 8):
            for _ in range(2):
                for name, target in paths.items():
                    report = asyncio.run(run_load(target, "sentiment", sentences, concurrency=clients,
                                                  duration=args.seconds))
                    row = {"path": name, "clients": clients, **report.summary()}
                    results["runs"].append(row)
                    print(f"{name:6} {clients} clients: {row['requests_per_s']:.1f} req/s, p50 {row['p50_ms']:.2f} "
                          f"ms, p99 {row['p99_ms']:.2f} ms, errors {row['errors']}", flush=True)
    summary = []
    for clients in (1, 8):
        rows = {name: [r for r in results["runs"] if r["path"] == name and r["clients"] == clients]
                for name in ("direct", "nginx")}
        p50 = {n: float(np.mean([r["p50_ms"] for r in rs])) for n, rs in rows.items()}
        p99 = {n: float(np.mean([r["p99_ms"] for r in rs])) for n, rs in rows.items()}
        summary.append({"clients": clients, "p50_direct_ms": p50["direct"], "p50_nginx_ms": p50["nginx"],
                        "p50_added_ms": p50["nginx"] - p50["direct"], "p99_direct_ms": p99["direct"],
                        "p99_nginx_ms": p99["nginx"], "p99_added_ms": p99["nginx"] - p99["direct"]})
    results["summary"] = summary
    print(json.dumps(summary, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

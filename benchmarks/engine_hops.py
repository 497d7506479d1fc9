"""The engine process's own ceiling: how many requests a second its event loop takes in and answers when nothing
else limits it, with no gRPC and no front end in the way.

With many front ends on a GPU, the engine process's one event loop is what bounds `bertzoo serve` (RESULTS.md,
"Serving on GPU"). This benchmark reproduces that bound on any machine: it starts the engine process as the server
does (`serving/engine_process.py`, the front-end probe's model, whose batches cost next to nothing) and plays the
front ends itself over the same ZeroMQ socket, keeping a window of jobs in flight, each hop carrying `--per-hop`
one-sentence requests (1: front ends under light load each, the GPU case; more: busy front ends). The engine's CPU
per request says what one request costs its loop; its rate is the ceiling a server could reach with free front ends.

    python -m benchmarks.engine_hops --probe DIR [--data DATA/ids-sst-dev.csv] [--per-hop 1 8] [--peers 1 12] \
        [--pad-to longest|bucket] [--seconds 10] [--rounds 3] [--model RUN --backend torch --device cuda --ceiling] \
        [--profile DIR] [--json FILE]

With `--model`, the engine serves that model instead (e.g. the CUDA engine of `gpu_serving.sh`): its rate against
the model's in-process ceiling says whether the engine process or the front ends hold a server back.

``--loop-alone [--batch-ms MS]``: only the engine's event loop, in this process, without ZeroMQ or a model's compute
(`benchmarks/common/engine_loop.py`): its own CPU per request, steady enough that a change to it shows in one run;
``--batch-ms`` gives each batch that much model time with the GIL let go (~0.5: batches grow as on a GPU).

``--profile DIR``: each row also samples the engine process with py-spy (where installed) into DIR, and its JSON row
and printout name the functions that held the loop's and the workers' time.

The load generator is one Python process on another core; it spends a fraction of the engine's time per request
(it sends prebuilt hops and reads the answers' job ids).
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path

import zmq

from benchmarks.common.processes import stat_cpu_seconds, thread_cpu_seconds
from benchmarks.common.profiling import finish_profile, profile_lines, start_profile
from benchmarks.common.timing import machine
from benchmarks.serve_frontends import build_probe
from bertzoo.serving import engine_protocol as protocol
from bertzoo.serving.config import BatchSettings, ServeConfig
from bertzoo.serving.engine import Work
from bertzoo.serving.load import load_items
from bertzoo.tokenization import Tokenizer

SENTENCE = "a gorgeous , witty , seductive movie ."


def start_engine(config: ServeConfig, run_dir: Path) -> tuple[multiprocessing.Process, object, str]:
    """The engine process as `bertzoo serve --frontends N` starts it (metrics in multiprocess mode)."""
    from bertzoo.serving.engine_process import engine_main

    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(run_dir / "metrics")
    (run_dir / "metrics").mkdir()
    context = multiprocessing.get_context("spawn")
    reader, control = context.Pipe(duplex=False)
    address = f"ipc://{run_dir / 'engine.sock'}"
    engine = context.Process(target=engine_main, name="bertzoo-engine",
                             args=(config, address, reader, {"": logging.WARNING, "bertzoo": logging.WARNING}))
    engine.start()
    reader.close()
    return engine, control, address


def connect(context: zmq.Context, address: str) -> zmq.Socket:
    """A front end's socket, hello sent (the engine answers READY once its model is warm)."""
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(address)
    socket.send_multipart(protocol.hello_message())
    return socket


def hop_frames(tokenizer: Tokenizer, sentences: list[str], first_id: int) -> list[bytes]:
    """One hop of one-sentence Sentiment requests, job ids from ``first_id`` on."""
    encodings = tokenizer.encode_sentences(sentences, 128)
    jobs = [(protocol.JobHeader(first_id + i, "main", None, [("sentiment", 1)]), [Work("sentiment", (e,))])
            for i, e in enumerate(encodings)]
    return protocol.jobs_message(jobs, [])


def drive(sockets: list[zmq.Socket], tokenizer: Tokenizer, sentences: list[str], per_hop: int, window: int,
          seconds: float, engine_pid: int) -> dict:
    """Keep ``window`` hops in flight for ``seconds``, spread over ``sockets`` (one per front end played); each
    answered hop is replaced by a new one on the same socket."""
    # Job ids only need to be unique among a socket's jobs in flight: a ring of prebuilt hops, one per window slot.
    ring = [hop_frames(tokenizer, [sentences[(slot * per_hop + i) % len(sentences)] for i in range(per_hop)],
                       slot * per_hop) for slot in range(window)]
    owner = {slot: sockets[slot % len(sockets)] for slot in range(window)}
    poller = zmq.Poller()
    for socket in sockets:
        poller.register(socket, zmq.POLLIN)
    for slot, frames in enumerate(ring):
        owner[slot].send_multipart(frames)
    outstanding = dict.fromkeys(range(window), per_hop)
    answered, in_flight = 0, window
    stat = Path(f"/proc/{engine_pid}/stat")
    cpu_before, driver_before = stat_cpu_seconds(stat), time.process_time()
    threads_before = thread_cpu_seconds(engine_pid)
    started = time.perf_counter()
    ends = started + seconds
    while in_flight:
        for socket, _ in poller.poll():
            while True:
                try:
                    frames = socket.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                if protocol.kind_of(frames[0]) is not protocol.Kind.RESULTS:
                    continue
                for job_id in protocol.read_results(frames[0]).job_ids():
                    slot = job_id // per_hop
                    outstanding[slot] -= 1
                    answered += 1
                    if outstanding[slot] == 0:  # every request of that hop is answered: send it again
                        in_flight -= 1
                        if time.perf_counter() < ends:
                            outstanding[slot] = per_hop
                            owner[slot].send_multipart(ring[slot])
                            in_flight += 1
    elapsed = time.perf_counter() - started
    cpu, driver = stat_cpu_seconds(stat) - cpu_before, time.process_time() - driver_before
    by_role = dict.fromkeys(("loop", "workers", "zeromq"), 0.0)
    for tid, (name, seconds) in thread_cpu_seconds(engine_pid).items():
        role = "loop" if tid == engine_pid else "zeromq" if name.startswith("ZMQbg") else "workers"
        by_role[role] += seconds - threads_before.get(tid, (name, 0.0))[1]
    # The driver busy near all the time means it, not the engine, set the rate.
    return {"requests": answered, "seconds": round(elapsed, 3), "requests_per_s": round(answered / elapsed, 1),
            "engine_cpu_ms_per_request": round(1000 * cpu / answered, 4),
            # The event loop's thread (the protocol, queueing, answering), the model's worker threads (padding, the
            # model, heads, post-processing) and ZeroMQ's I/O thread, ms per request each.
            "engine_cpu_ms_per_request_by_thread": {role: round(1000 * seconds / answered, 4)
                                                    for role, seconds in by_role.items()},
            "engine_cores_busy": round(cpu / elapsed, 3), "driver_cores_busy": round(driver / elapsed, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--probe", default=None, help="directory of the front-end probe's model (built if absent)")
    parser.add_argument("--model", default=None, help="serve this artifact or checkpoint instead of the probe")
    parser.add_argument("--backend", default="onnxruntime")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--variant", default="fp32")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--instances", type=int, default=1)
    parser.add_argument("--pad-to", default="longest", choices=["longest", "bucket"],
                        help="the batcher's padding (bertzoo serve's default: bucket on a GPU, longest on the CPU)")
    parser.add_argument("--per-hop", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--window", type=int, default=64, help="requests in flight")
    parser.add_argument("--peers", type=int, nargs="+", default=[1], help="front ends played (one socket each)")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--data", default=None, help="ids-sst-dev.csv: its first sentences (default: one sentence)")
    parser.add_argument("--ceiling", action="store_true",
                        help="with --device cuda and a checkpoint: the engine's in-process ceiling first")
    parser.add_argument("--loop-alone", action="store_true",
                        help="the engine's event loop alone, in this process (benchmarks/common/engine_loop.py)")
    parser.add_argument("--batch-ms", type=float, default=0.0,
                        help="with --loop-alone: each batch's model time, the GIL let go (a GPU's: ~0.5)")
    parser.add_argument("--sentences-per-request", type=int, default=1,
                        help="with --loop-alone: Sentiment requests of this many sentences (one work each)")
    parser.add_argument("--profile", default=None, metavar="DIR",
                        help="sample the engine process with py-spy during each row, its stacks into DIR")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if (args.probe is None) == (args.model is None):
        parser.error("give --probe DIR (the front-end probe's model) or --model PATH")
    model = args.model or str(build_probe(Path(args.probe)))
    config = ServeConfig(model, backend=args.backend, device=args.device, variant=args.variant, threads=args.threads,
                         instances=args.instances, frontends=2, batch=BatchSettings(pad_to=args.pad_to))
    results = {"machine": machine(), "model": model, "backend": args.backend, "device": args.device,
               "variant": args.variant, "threads": args.threads, "instances": args.instances, "pad_to": args.pad_to,
               "window_requests": args.window, "data": args.data, "rows": []}
    print(json.dumps(results["machine"]), flush=True)
    sentences = (load_items("sentiment", args.data)[:max(args.window * args.sentences_per_request, 64)] if args.data
                 else [SENTENCE])
    if args.loop_alone:
        from benchmarks.common.engine_loop import loop_alone

        results["batch_ms"] = args.batch_ms
        results["rows"] = loop_alone(model, sentences, args.per_hop, max(args.peers), args.window, args.seconds,
                                     args.rounds, args.batch_ms / 1000, args.sentences_per_request, args.pad_to)
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1))
        return
    if args.ceiling:
        from benchmarks.gpu_check import cuda_ceiling

        found = cuda_ceiling(model, sentences * (1100 // len(sentences)), device=args.device)
        results["ceiling"] = found
        print(f"in-process ceiling {found['best']:.1f}/s (median pass {found['median']:.1f}/s); the server's engine "
              f"path {found['engine']['best']:.1f}/s; the model alone {found['model']['best']:.1f}/s", flush=True)
    with tempfile.TemporaryDirectory(prefix="engine-hops-") as tmp:
        engine, control, address = start_engine(config, Path(tmp))
        context = zmq.Context()
        sockets = [connect(context, address) for _ in range(max(args.peers))]
        try:
            tokenizer = Tokenizer.from_str(protocol.read_ready(sockets[0].recv_multipart()[0]).tokenizer_json)
            for socket in sockets[1:]:
                socket.recv_multipart()  # its READY
            drive(sockets[:1], tokenizer, sentences, 1, 8, 1.0, engine.pid)  # warm-up
            for round_ in range(args.rounds):
                for peers in args.peers:
                    for per_hop in args.per_hop:
                        profiles = []
                        if args.profile:  # two samplers side by side: where the threads are busy, who holds the GIL
                            Path(args.profile).mkdir(parents=True, exist_ok=True)
                            name = f"engine_r{round_ + 1}_p{peers}_h{per_hop}"
                            profiles = [start_profile(engine.pid, args.seconds, Path(args.profile) / f"{name}{tail}.txt",
                                                      gil=gil) for tail, gil in (("", False), ("_gil", True))]
                        row = {"round": round_ + 1, "peers": peers, "per_hop": per_hop,
                               **drive(sockets[:peers], tokenizer, sentences, per_hop,
                                       max(1, args.window // per_hop), args.seconds, engine.pid)}
                        if args.profile:  # the event loop is the engine process's main thread
                            row["profile"], row["profile_gil"] = (
                                finish_profile(p, engine.pid) or {"error": "py-spy is not installed"} for p in profiles)
                        results["rows"].append(row)
                        print(f"round {row['round']} peers {peers:2d} per hop {per_hop:3d}: "
                              f"{row['requests_per_s']:9.1f} requests/s, engine CPU "
                              f"{row['engine_cpu_ms_per_request']:.4f} ms per request ("
                              + ", ".join(f"{role} {ms:.4f}" for role, ms in
                                          row["engine_cpu_ms_per_request_by_thread"].items())
                              + "); cores busy: engine "
                              f"{row['engine_cores_busy']:.2f}, driver {row['driver_cores_busy']:.2f}", flush=True)
                        for line in [*profile_lines(row.get("profile")), *profile_lines(row.get("profile_gil"))]:
                            print("  " + line, flush=True)
        finally:
            for socket in sockets:
                socket.close(0)
            context.term()
            control.close()  # the engine's word to stop
            engine.join(30)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    sys.exit(main())

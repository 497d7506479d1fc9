"""What gRPC itself costs per request in Python: a unary call against a message on an open bidirectional stream.

    python benchmarks/grpc_call_cost.py [--seconds 8] [--rounds 2] [--clients 64]

A bare grpc.aio echo server (uvloop where installed, as `bertzoo serve` runs) in its own process, and in this one 64
asyncio clients, each with one request in flight: either a unary call per request, or write-then-read on one stream
per client. Reports messages/s and the CPU time per message of the server process and of the clients, in
alternating rounds. No model, no protobuf: what is left is the transport's own cost, the part of a one-sentence
request that the *Stream RPCs save.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import time

import grpc
from timing import machine

PAYLOAD = b"x" * 120  # about one SST sentence as a serialized request
SERVICE = "bench.Echo"


async def _serve(port: int, ready, mark, stop, cpu) -> None:
    async def unary(request: bytes, context) -> bytes:
        return request

    async def stream(requests, context):
        async for request in requests:
            yield request

    handler = grpc.method_handlers_generic_handler(SERVICE, {
        "Unary": grpc.unary_unary_rpc_method_handler(unary),
        "Stream": grpc.stream_stream_rpc_method_handler(stream)})
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    ready.set()
    marked = None
    while not stop.is_set():  # the CPU time from the client's mark (the timed load's start) to its stop
        if marked is None and mark.is_set():
            marked = time.process_time()
        await asyncio.sleep(0.002)
    cpu.put(time.process_time() - marked)
    await server.stop(1)


def _server_process(port: int, ready, mark, stop, cpu) -> None:
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(_serve(port, ready, mark, stop, cpu))


async def _load(port: int, mode: str, seconds: float, clients: int) -> int:
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    count = 0
    end = time.perf_counter() + seconds

    async def client() -> None:
        nonlocal count
        if mode == "unary":
            call = channel.unary_unary(f"/{SERVICE}/Unary")
            while time.perf_counter() < end:
                await call(PAYLOAD)
                count += 1
        else:
            call = channel.stream_stream(f"/{SERVICE}/Stream")()
            while time.perf_counter() < end:
                await call.write(PAYLOAD)
                await call.read()
                count += 1
            await call.done_writing()

    await asyncio.gather(*(client() for _ in range(clients)))
    await channel.close()
    return count


def one_round(mode: str, seconds: float, clients: int, port: int) -> dict:
    ready, mark, stop, cpu = mp.Event(), mp.Event(), mp.Event(), mp.Queue()
    server = mp.Process(target=_server_process, args=(port, ready, mark, stop, cpu))
    server.start()
    ready.wait(30)
    asyncio.run(_load(port, mode, 1.0, clients))  # warm-up: connections, stream setup
    mark.set()
    time.sleep(0.01)
    client0 = time.process_time()
    messages = asyncio.run(_load(port, mode, seconds, clients))
    client_cpu = time.process_time() - client0
    stop.set()
    server_cpu = cpu.get(timeout=30)
    server.join()
    return {"mode": mode, "messages": messages, "messages_per_s": messages / seconds,
            "server_cpu_us_per_message": server_cpu / messages * 1e6,
            "client_cpu_us_per_message": client_cpu / messages * 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--port", type=int, default=50999)
    parser.add_argument("--out", help="also write the rounds as JSON here")
    args = parser.parse_args()
    rounds = []
    for _ in range(args.rounds):
        for mode in ("unary", "stream"):
            r = one_round(mode, args.seconds, args.clients, args.port)
            rounds.append(r)
            print(f"{mode:6s} {r['messages_per_s']:8.0f} messages/s, server {r['server_cpu_us_per_message']:5.0f} us "
                  f"CPU per message, clients {r['client_cpu_us_per_message']:5.0f} us", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({**machine(), "clients": args.clients, "seconds": args.seconds,
                       "rounds": rounds}, f, indent=1)


if __name__ == "__main__":
    main()

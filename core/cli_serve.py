"""``bertzoo serve``, ``bertzoo client`` and ``bertzoo bench-serve``: the server and the commands that call one.

serve's options take their defaults from ``bertzoo.serving.config`` and their choices from the backend table
(``bertzoo.serving.backends.BACKENDS``), imported when this module loads (numpy and the backends' light modules; no
onnxruntime, openvino, torch or grpc). The rest of the serving package (server, client, load generator) is imported
only when a command runs, so ``bertzoo --help`` stays fast."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
from pathlib import Path

import click

SERVE_TASKS = ("sentiment", "paraphrase", "similarity", "qa", "embed")


def _backend_choices() -> tuple[click.Choice, str]:
    """serve --backend's choices and help: the names and summaries of the backend table."""
    from bertzoo.serving.backends import BACKENDS

    return (click.Choice(["auto", *BACKENDS]),
            "auto: on the CPU, the fastest engine and --instances that keep fp32-level agreement, measured at the "
            "artifact's first start on this machine (~15 s on 2 cores; cached, --retune measures again); "
            "onnxruntime with --device cuda; "
            + "; ".join(f"{name}: {entry.summary}" for name, entry in BACKENDS.items()) + ".")


def _config_choices(name: str) -> click.Choice:
    """The values any backend takes for --device or --precision (bertzoo.serving.config.DEVICES, PRECISIONS)."""
    from bertzoo.serving import config

    return click.Choice(list(getattr(config, name)))


def _serve_option(*decls: str, name: str, **kwargs):
    """A `serve` option whose default is ServeConfig's (or BatchSettings') and which BERTZOO_<NAME> also sets."""
    from bertzoo.serving.config import BatchSettings, ServeConfig

    fields = {**BatchSettings.__dataclass_fields__, **ServeConfig.__dataclass_fields__}
    if "default" not in kwargs and name in fields:
        kwargs["default"] = fields[name].default
    return click.option(*decls, name, envvar=f"BERTZOO_{name.upper()}", show_envvar=True, **kwargs)


@click.command()
@click.argument("model_dir", type=click.Path(exists=True, file_okay=False), envvar="BERTZOO_MODEL_DIR")
@_serve_option("--port", name="port", type=int, help="gRPC port.")
@_serve_option("--host", name="host", help="Address the gRPC port binds to.")
@_serve_option("--metrics-port", name="metrics_port", type=int, help="Prometheus /metrics port; 0: none.")
@_serve_option("--http-port", name="http_port", type=int,
               help="HTTP/1.1 port of the JSON routes (OpenAI's /v1/embeddings, /sentiment, ..., /health, /info); 0: none.")
@_serve_option("--metrics-host", name="metrics_host", help="Address of the metrics endpoint (local by default).")
@_serve_option("--variant", name="variant", type=click.Choice(["auto", "fp32", "optimized", "int8"]), default="auto",
               help="The artifact's encoder (onnxruntime); auto: the fastest it holds whose export parity gates passed "
                    "(int8, then optimized, then fp32).")
@_serve_option("--backend", name="backend", type=_backend_choices()[0], default="auto", help=_backend_choices()[1])
@_serve_option("--device", name="device", type=_config_choices("DEVICES"),
               help="cuda: the first visible NVIDIA GPU (onnxruntime needs the onnxruntime-gpu package).")
@_serve_option("--precision", name="precision", type=_config_choices("PRECISIONS"),
               help="torch: what the encoder computes in, auto = fp16 on cuda, fp32 on cpu; openvino: fp32 or bf16, "
                    "auto = bf16 where the CPU has native bf16 (AVX-512 BF16, AMX), else fp32.")
@_serve_option("--frontends", name="frontends", type=str, default="auto",
               help="Processes doing gRPC, tokenization and post-processing in front of one engine process; 1: one "
                    "process for everything. auto: on the CPU (--threads or the cores) // 8, at least 1; on a GPU half "
                    "the cores, at most 8.")
@_serve_option("--engines", name="engines", type=str, default="auto",
               help="Engine processes (replicas of the model) behind the front ends, each request to the one with the "
                    "fewest outstanding; auto: 1 (on the CPU --instances share the cores instead; on a GPU force it to "
                    "compare).")
@_serve_option("--instances", name="instances", type=str, default="auto",
               help="Engine instances running batches side by side (CPU engines), the --threads shared out among "
                    "them; auto: one per core up to 4 cores, one per 2 cores above (at most 8); 1 on a GPU.")
@_serve_option("--threads", name="threads", type=int, help="Backend intra-op threads [default: all cores].")
@_serve_option("--max-items", name="max_items", type=int, help="Items per request.")
@_serve_option("--max-text-chars", name="max_text_chars", type=int,
               help="Characters per text, QA contexts included; longer texts are rejected.")
@_serve_option("--max-request-tokens", name="max_request_tokens", type=int,
               help="Encoder tokens per request (every sentence and QA window); costlier requests are refused with "
                    "INVALID_ARGUMENT.")
@_serve_option("--max-message-bytes", name="max_message_bytes", type=int,
               help="Bytes per request message; larger ones are answered RESOURCE_EXHAUSTED and counted [default: "
                    "room for --max-items pairs of --max-text-chars 4-byte characters].")
@_serve_option("--overlong", name="overlong", type=click.Choice(["truncate", "reject"]),
               help="A sentence over the model's max_seq_length tokens (or a question over qa_max_question_tokens): "
                    "truncate it as training did, or reject the request with INVALID_ARGUMENT.")
@_serve_option("--stream-window", name="stream_window", type=int,
               help="Requests of one stream (the *Stream RPCs) worked on at a time; the server reads no more of that "
                    "stream until one is answered.")
@_serve_option("--long-request-tokens", name="long_request_tokens", type=int,
               help="Requests costing more encoder tokens than this run in the long-request lane, at low CPU "
                    "priority, so short requests are not held behind them.")
@_serve_option("--max-batch-size", name="max_batch_size", type=int, help="Sequences per encoder batch.")
@_serve_option("--max-batch-tokens", name="max_batch_tokens", type=int,
               help="Padded tokens (sequences x length bucket) per encoder batch.")
@_serve_option("--max-queue", name="max_queue", type=int,
               help="Requests waiting for the model; more are answered RESOURCE_EXHAUSTED.")
@_serve_option("--max-queue-delay-ms", name="max_queue_delay_ms", type=float,
               help="How long an idle model waits to fill a batch; 0: never.")
@_serve_option("--pad-to", name="pad_to", type=click.Choice(["longest", "bucket"]), default=None,
               help="Pad a batch to its longest sequence (least compute on CPU) or to its length bucket (fixed shapes) "
                    "[default: bucket on a GPU, where engines and CUDA graphs want few shapes; longest on the CPU].")
@_serve_option("--tls-cert", name="tls_cert", type=click.Path(exists=True, dir_okay=False),
               help="PEM certificate (chain); with --tls-key the server speaks TLS only.")
@_serve_option("--tls-key", name="tls_key", type=click.Path(exists=True, dir_okay=False), help="PEM private key.")
@_serve_option("--tls-client-ca", name="tls_client_ca", type=click.Path(exists=True, dir_okay=False),
               help="PEM CA bundle: require a client certificate it signed (mTLS).")
@_serve_option("--auth-token", name="auth_token",
               help="Require 'authorization: Bearer <token>' on every call but health checks. Prefer the environment "
                    "variable or --auth-token-file: a command line is visible to other users.")
@click.option("--auth-token-file", type=click.Path(exists=True, dir_okay=False), envvar="BERTZOO_AUTH_TOKEN_FILE",
              show_envvar=True, help="Read the token from this file.")
@_serve_option("--verify-key", name="verify_key", type=click.Path(exists=True, dir_okay=False),
               help="Ed25519 public key (PEM): serve only an artifact whose manifest it signed (export --sign-key).")
@_serve_option("--max-connection-age", name="max_connection_age", type=float,
               help="Seconds before a client connection is asked to reconnect (calls in flight get --shutdown-grace, "
                    "at least 5 s), so connections spread again over front ends and replicas; 0: never.")
@_serve_option("--shutdown-grace", name="shutdown_grace", type=float,
               help="Seconds accepted requests get to finish after SIGTERM.")
@_serve_option("--warmup/--no-warmup", name="warmup", help="Run every length bucket once before reporting SERVING.")
@_serve_option("--warmup-largest/--no-warmup-largest", name="warmup_largest",
               help="Also run the largest batches --max-batch-tokens and --max-batch-size allow before reporting "
                    "SERVING, so each engine's memory is at its ceiling from the start (what a container's limit must "
                    "allow); seconds more to start.")
@_serve_option("--tokenize-threads", name="tokenize_threads", type=int, help="Tokenizer threads.")
@_serve_option("--pin-instances/--no-pin-instances", name="pin_instances",
               help="With --instances over 1 and their threads adding up to every core this process may use, run each "
                    "instance on cores of its own (the event loop on any); off: the scheduler places them.")
@_serve_option("--ort-spinning/--no-ort-spinning", name="ort_spinning",
               help="ONNX Runtime threads spin between ops: lower latency, busier idle CPU.")
@_serve_option("--openvino-cache-dir", name="openvino_cache_dir", type=click.Path(file_okay=False),
               help="openvino: where compiled models are cached, so a restart does not compile again "
                    "[default: ~/.cache/bertzoo/openvino].")
@click.option("--retune", is_flag=True, help="With --backend auto on the CPU: measure the engines again instead of "
              "reading the choice cached for this artifact and machine.")
@_serve_option("--cuda-graphs/--no-cuda-graphs", name="cuda_graphs",
               help="torch backend on cuda: replay the encoder as one captured CUDA graph per batch shape.")
def serve(auth_token_file: str | None, max_batch_size: int, max_batch_tokens: int, max_queue: int,
          max_queue_delay_ms: float, pad_to: str, retune: bool, **options) -> None:
    """Serve MODEL_DIR over gRPC (bertzoo.v1.Bertzoo, health, reflection) until SIGTERM, with a dynamic batcher and
    Prometheus metrics. Every option can also be set by the environment variable shown."""
    from bertzoo.artifact import ArtifactError
    from bertzoo.serving.backends import BackendUnavailable, check_available, check_model_dir
    from bertzoo.serving.config import BatchSettings, ServeConfig
    from bertzoo.serving.frontends import run_with_frontends
    from bertzoo.serving.grpc_server import run_serve

    if auth_token_file:
        options["auth_token"] = Path(auth_token_file).read_text().strip()
    if pad_to is None:
        pad_to = "bucket" if options["device"] == "cuda" else "longest"
    try:
        # Before the port is bound: one line naming what to install, or what MODEL_DIR should be.
        check_model_dir("onnxruntime" if options["backend"] == "auto" else options["backend"], options["model_dir"],
                        options["verify_key"])
        _resolve_auto(options, retune)
        check_available(options["backend"], options["device"])
        batch = BatchSettings(max_batch_size, max_batch_tokens, max_queue, max_queue_delay_ms, pad_to)
        config = ServeConfig(batch=batch, **options)
    except (ArtifactError, BackendUnavailable, FileNotFoundError) as e:
        raise click.ClickException(str(e)) from e
    except ValueError as e:
        raise click.UsageError(str(e)) from e
    try:
        if config.frontends == 1 and config.engines == 1:
            run_serve(config)
        elif code := run_with_frontends(config):
            sys.exit(code)
    except (ArtifactError, BackendUnavailable, FileNotFoundError, OSError) as e:
        raise click.ClickException(str(e)) from e


def _resolve_auto(options: dict, retune: bool = False) -> None:
    """Replace each ``auto`` of --backend, --variant, --instances, --frontends and --engines by what it means on this
    machine and artifact (on the CPU, the engine by measurement: bertzoo.serving.engine_choice; the rest by
    bertzoo.serving.machine_defaults), and log the choice; a number must be a positive count."""
    import logging

    from bertzoo.serving import machine_defaults as auto
    from bertzoo.serving.backends import BACKENDS

    log = logging.getLogger("bertzoo.serving")
    chosen = []
    for name in ("instances", "frontends", "engines"):
        value = options[name]
        if value != "auto" and not (value.isdigit() and int(value) >= 1):
            raise click.BadParameter(f"{value!r} is neither auto nor a count >= 1", param_hint=f"--{name}")
    if options["backend"] == options["variant"] == "auto" and options["device"] == "cpu":
        from bertzoo.serving.engine_choice import choose

        forced = None if options["instances"] == "auto" else int(options["instances"])
        choice = choose(options["model_dir"], options["threads"], forced, retune)
        engine = choice.chosen
        options.update(backend=engine.backend, variant=engine.variant, instances=str(engine.instances),
                       engine_choice=choice.table())
        if engine.backend == "openvino":
            options["precision"] = engine.precision
        log.info("engine for --backend auto (%s): %s", choice.source, engine.label())
        for line in choice.table():
            log.info("  %s", line)
    if options["backend"] == "auto":
        options["backend"] = auto.backend(options["model_dir"], options["device"], options["variant"] != "auto")
        chosen.append(f"backend {options['backend']}")
    if options["variant"] == "auto":  # a backend without variants reads fp32 as its one encoder (tensorrt: its engine)
        options["variant"] = "fp32"
        if BACKENDS[options["backend"]].variants:
            options["variant"] = auto.variant(options["model_dir"])
            chosen.append(f"variant {options['variant']}")
    for name, rule in (("instances", lambda: auto.instances(options["backend"], options["device"], options["threads"])),
                       ("frontends", lambda: auto.frontends(options["device"], options["threads"])),
                       ("engines", lambda: auto.engines(options["device"]))):
        value = options[name]
        if value == "auto":
            options[name] = rule()
            chosen.append(f"{name} {options[name]}")
        else:
            options[name] = int(value)
    if chosen:
        log.info("auto on %d cores: %s (any can be forced by its flag)", auto.cores(), ", ".join(chosen))


def _client_options(command):
    """The connection options of the commands that call a server, handed to the command as one ``connection`` dict
    of BertzooClient's keyword arguments (and ``timeout``)."""

    @functools.wraps(command)
    def with_connection(*args, target: str, auth_token: str | None, token: str | None, tls: bool, tls_ca: str | None,
                        tls_client_cert: str | None, tls_client_key: str | None, **kwargs):
        if (tls_client_cert is None) != (tls_client_key is None):
            raise click.UsageError("--tls-client-cert and --tls-client-key go together")
        if auth_token is not None and token is not None and auth_token != token:
            raise click.UsageError("--token is the old name of --auth-token: pass one of them")
        connection = {"target": target, "token": auth_token if auth_token is not None else token,
                      "tls": tls or tls_client_cert is not None,
                      "root_certificates": tls_ca, "certificate_chain": tls_client_cert, "private_key": tls_client_key}
        return command(*args, connection=connection, **kwargs)

    pem = click.Path(exists=True, dir_okay=False)
    for decorator in (
        click.option("--target", default="localhost:50051", envvar="BERTZOO_TARGET", show_envvar=True,
                     help="Server address, host:port."),
        # --auth-token, as `serve` spells the token it wants; --token, its old name, stays hidden.
        click.option("--auth-token", envvar="BERTZOO_AUTH_TOKEN", show_envvar=True,
                     help="Bearer token, if the server wants one (serve --auth-token)."),
        click.option("--token", hidden=True, help="The old name of --auth-token."),
        click.option("--tls", is_flag=True, help="Connect with TLS (system root certificates)."),
        click.option("--tls-ca", type=pem, help="Connect with TLS, trusting this PEM certificate (implies --tls)."),
        click.option("--tls-client-cert", type=pem, envvar="BERTZOO_TLS_CLIENT_CERT", show_envvar=True,
                     help="PEM client certificate, for servers that require one (mTLS; implies --tls)."),
        click.option("--tls-client-key", type=pem, envvar="BERTZOO_TLS_CLIENT_KEY", show_envvar=True,
                     help="PEM private key of --tls-client-cert."),
        click.option("--timeout", type=float, default=30.0, help="Deadline per call, seconds."),
    ):
        with_connection = decorator(with_connection)
    return with_connection


def _quiet_when_stdout_closes(command):
    """A reader that stops early (`bertzoo client ... | head -1`) closes stdout while answers still come: end as `yes`
    does in `yes | head -1`, without a message and with status 141 (128 + SIGPIPE), not with an error."""

    @functools.wraps(command)
    def quiet(*args, **kwargs):
        try:
            try:
                return command(*args, **kwargs)
            finally:
                sys.stdout.flush()  # what is still buffered fails here, not in the interpreter's flush at exit
        except BrokenPipeError:
            with contextlib.suppress(OSError, ValueError):  # (no descriptor under click's test runner)
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the flush at exit goes nowhere
            sys.exit(141)

    return quiet


@click.command("client")
@click.argument("task", type=click.Choice([*SERVE_TASKS, "info", "health"]))
@click.argument("texts", nargs=-1)
@_client_options
@click.option("--service", default="", help="health: the service to check (bertzoo.v1.Bertzoo); '' is the server.")
@click.option("--wait", type=float, default=0.0,
              help="health: check again until SERVING or this many seconds have passed (0: check once).")
@click.option("--input", "input_file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Answer every input of this file instead of TEXTS, one JSON line each, in order (over streams): "
                   "JSON lines ({\"text\": ...}; {\"text_a\": ..., \"text_b\": ...}; {\"question\": ..., "
                   "\"context\": ...}), a .txt of one text per line, ids-sst-*.csv / GLUE .tsv, quora / sts .csv "
                   "or SQuAD .json.")
@click.option("--output", type=click.Path(dir_okay=False, writable=True), default=None,
              help="With --input: write the JSON lines here (whole, or not at all) instead of to stdout.")
@_quiet_when_stdout_closes
def client_command(task: str, texts: tuple[str, ...], connection: dict, timeout: float, service: str,
                   wait: float, input_file: str | None, output: str | None) -> None:
    """Call a bertzoo server and print the answer as JSON. sentiment / embed: TEXT...; paraphrase / similarity:
    TEXT_A TEXT_B [TEXT_A TEXT_B ...]; qa: QUESTION CONTEXT; info; health. With --input FILE, every input of the
    file instead, one JSON line each.

    health is a probe for scripts, containers and orchestrators: exit code 0 only when SERVING; 2 when the server
    cannot be reached (or the deadline passed); 3 when the health RPC failed; 4 for any other status (NOT_SERVING while
    loading or draining, SERVICE_UNKNOWN); 5 for a TLS or authorization failure. The reason goes to stderr."""
    import grpc

    from bertzoo.serving.client import BertzooClient
    from bertzoo.serving.health_probe import HEALTH_SERVING, wait_for_health
    from bertzoo.serving.proto import answer_fields

    if task == "health":
        if wait < 0:
            raise click.UsageError("--wait must be >= 0")
        with BertzooClient(**connection, timeout=timeout) as client:
            code, what = wait_for_health(client, service, wait=wait, timeout=min(timeout, 5.0) if wait else timeout)
        if code == HEALTH_SERVING:
            click.echo(json.dumps({"status": what}))
        else:
            click.echo(f"{connection['target']}: {what}", err=True)
        sys.exit(code)

    if input_file is not None or output is not None:
        _answer_file(task, texts, input_file, output, connection, timeout)
        return
    pairs = list(zip(texts[::2], texts[1::2], strict=False))
    if task in ("sentiment", "embed") and not texts:
        raise click.UsageError(f"{task} needs at least one TEXT")
    if task in ("paraphrase", "similarity") and (not texts or len(texts) % 2):
        raise click.UsageError(f"{task} takes TEXT_A TEXT_B pairs, got {len(texts)} texts")
    if task == "qa" and len(texts) != 2:
        raise click.UsageError(f"qa takes QUESTION CONTEXT, got {len(texts)} texts")
    with BertzooClient(**connection, timeout=timeout) as client:
        try:
            calls = {"sentiment": lambda: client.sentiment(texts), "embed": lambda: client.embed(texts),
                     "paraphrase": lambda: client.paraphrase(pairs), "similarity": lambda: client.similarity(pairs),
                     "qa": lambda: client.qa(pairs), "info": client.model_info}
            response = calls[task]()
        except grpc.RpcError as e:
            raise click.ClickException(_rpc_error_line(e, connection["target"])) from e
    shown = answer_fields(response)
    click.echo(json.dumps(shown, indent=2, ensure_ascii=False))


def _rpc_error_line(error, target: str) -> str:
    """A failed call as one line; a server that cannot be reached at all, or an address that answers HTTP/1.x instead
    of gRPC (the metrics port), named as such, with the option to change."""
    import grpc

    from bertzoo.serving.client_channel import answers_http1, http1_reason

    details = error.details() or ""
    if error.code() == grpc.StatusCode.UNAVAILABLE and answers_http1(details):
        return f"{target} {http1_reason()}"
    if error.code() == grpc.StatusCode.UNAVAILABLE and any(
            words in details for words in ("failed to connect", "Connection refused", "connections to all backends",
                                           "DNS resolution failed")):
        return f"nothing answers at {target}: is `bertzoo serve` running there? (--target)"
    return f"{error.code().name}: {details}"


def _answer_file(task: str, texts: tuple[str, ...], input_file: str | None, output: str | None, connection: dict,
                 timeout: float) -> None:
    """``bertzoo client TASK --input FILE [--output FILE]``: serving/bulk.py, with a progress bar on a terminal; the
    output file is written whole or not at all."""
    from contextlib import nullcontext

    import grpc
    from tqdm import tqdm

    from bertzoo.atomic import atomic_open
    from bertzoo.data import DataError
    from bertzoo.serving.bulk import answer_inputs
    from bertzoo.serving.client import BertzooClient
    from bertzoo.serving.load import TASK_METHODS, load_items

    if task not in TASK_METHODS:
        raise click.UsageError(f"--input answers a task's inputs: {', '.join(TASK_METHODS)}, not {task}")
    if input_file is None or texts:
        raise click.UsageError("--input FILE replaces TEXTS (and --output needs --input)")
    try:
        items = load_items(task, input_file)
    except (DataError, ValueError, OSError) as e:
        raise click.ClickException(str(e)) from e  # it names the file (and line)
    try:
        with BertzooClient(**connection, timeout=timeout) as client, \
                (nullcontext(sys.stdout) if output is None else atomic_open(Path(output))) as sink:
            answers = answer_inputs(client, task, items, timeout=None)  # no deadline for the whole file
            for answer in tqdm(answers, total=len(items), desc=task, unit="input", file=sys.stderr, disable=None,
                               leave=False):
                sink.write(json.dumps(answer, ensure_ascii=False) + "\n")
    except grpc.RpcError as e:
        raise click.ClickException(_rpc_error_line(e, connection["target"])) from e
    except BrokenPipeError:  # stdout's reader stopped early: client_command ends quietly
        raise
    except OSError as e:  # the output's folder is missing or not writable (or stdout's disk is full)
        raise click.ClickException(f"{'stdout' if output is None else f'--output {output}'}: {e.strerror or e}") from e


@click.command("bench-serve")
@click.option("--task", type=click.Choice(SERVE_TASKS), default="sentiment", help="The RPC to load.")
# --input, as `client --input` names a file of inputs (train, eval and export's --data is a data directory); --data,
# its old name, stays hidden.
@click.option("--input", "input_file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Inputs: an SST dev file (ids-sst-dev.csv, GLUE .tsv, or a .txt of one text per line) for "
                   "sentiment / embed, quora / sts .csv for the pair tasks, SQuAD .json for qa [default: the bundled "
                   "dev sample].")
@click.option("--data", "data_alias", type=click.Path(exists=True, dir_okay=False), default=None, hidden=True,
              help="The old name of --input.")
@click.option("--concurrency", type=int, default=8, help="Concurrent clients, each with its own connection.")
@click.option("--duration", type=float, default=10.0, help="Seconds to run (unless --requests).")
@click.option("--requests", "request_count", type=int, default=None, help="Send this many requests, then stop.")
@click.option("--items", type=int, default=1, help="Items per request.")
@click.option("--stream", is_flag=True, help="Each client sends its requests over one call of the streaming RPC "
              "(SentimentStream, ...) instead of one call each.")
@click.option("--json-out", type=click.Path(dir_okay=False), default=None, help="Also write the summary as JSON.")
@_client_options
def bench_serve(task: str, input_file: str | None, data_alias: str | None, concurrency: int, duration: float,
                request_count: int | None, items: int, stream: bool, json_out: str | None, connection: dict,
                timeout: float) -> None:
    """Load-test a running server: N concurrent clients with real sentences; throughput, p50/p95/p99, errors."""
    import asyncio

    from bertzoo.serving.client import BertzooClient
    from bertzoo.serving.load import format_report, load_items, run_load

    if concurrency < 1 or items < 1:
        raise click.UsageError("--concurrency and --items must be >= 1")
    inputs = load_items(task, input_file or data_alias)
    with BertzooClient(**connection) as client:
        try:
            client.wait_ready(timeout=timeout)
        except TimeoutError as e:
            raise click.ClickException(str(e)) from e
    report = asyncio.run(run_load(connection, task, inputs, concurrency=concurrency,
                                  duration=None if request_count else duration, requests=request_count,
                                  items_per_request=items, timeout=timeout, progress=True, stream=stream))
    summary = report.summary()
    click.echo(format_report(summary))
    if json_out:
        Path(json_out).write_text(json.dumps(summary, indent=2))

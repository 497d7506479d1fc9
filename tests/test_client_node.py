"""A client in another language, built from the .proto alone: tests/clients/node/client.mjs (Node.js, @grpc/grpc-js
and @grpc/proto-loader, which read the .proto at run time) calls every task's unary RPC, ModelInfo and a stream, and
its answers must be the Python client's. What the proto file says is then all a client needs: no Python-only
conventions, imports or field names.

Needs node and the client's packages (`npm ci --prefix tests/clients/node`, which .ci/run does); skips without them."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from bertzoo.datafiles import load_split, samples_dir
from bertzoo.serving.client import BertzooClient
from bertzoo.serving.grpc_server import ServerThread
from conftest import serve_config

ROOT = Path(__file__).resolve().parent.parent
NODE_CLIENT = ROOT / "tests" / "clients" / "node"
PROTO = ROOT / "protos" / "bertzoo" / "v1" / "bertzoo.proto"

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    shutil.which("node") is None or not (NODE_CLIENT / "node_modules" / "@grpc" / "grpc-js").is_dir(),
    reason="needs node and `npm ci --prefix tests/clients/node` (.ci/run installs both)")]


def plain(message: Message) -> dict:
    """A message as proto-loader's objects show it (defaults included, unset sub-messages None, each oneof's name
    mapped to the field that is set), without the timings, which differ from call to call."""
    out: dict = {}
    for field in message.DESCRIPTOR.fields:
        if field.name == "timing":
            continue
        value = getattr(message, field.name)
        is_message = field.type == FieldDescriptor.TYPE_MESSAGE
        if is_message and field.message_type.GetOptions().map_entry:
            out[field.name] = dict(value)
        elif is_message and field.is_repeated:
            out[field.name] = [plain(v) for v in value]
        elif is_message:
            out[field.name] = plain(value) if message.HasField(field.name) else None
        elif field.is_repeated:
            out[field.name] = list(value)
        else:
            out[field.name] = value
    for oneof in message.DESCRIPTOR.oneofs:
        out[oneof.name] = message.WhichOneof(oneof.name)
    return out


def assert_same(node, python, where: str = "") -> None:
    """Equal, numbers up to float rounding: the two clients' requests are batched with different neighbours."""
    if isinstance(python, dict):
        node = {key: value for key, value in node.items() if key != "timing"}
        assert set(node) == set(python), where
        for key in python:
            assert_same(node[key], python[key], f"{where}.{key}")
    elif isinstance(python, list):
        assert len(node) == len(python), where
        for i, (n, p) in enumerate(zip(node, python, strict=True)):
            assert_same(n, p, f"{where}[{i}]")
    elif isinstance(python, float):
        np.testing.assert_allclose(node, python, atol=1e-4, err_msg=where)
    else:
        assert node == python, where


def test_a_node_client_built_from_the_proto_gets_the_python_clients_answers(tiny_artifact, tmp_path):
    _, artifact = tiny_artifact
    texts = [e.text for e in load_split(samples_dir(), "sentiment", "dev")[:5]]
    pairs = [(e.text_a, e.text_b) for e in load_split(samples_dir(), "similarity", "dev")[:3]]
    questions = [(e.question, e.context) for e in load_split(samples_dir(), "qa", "dev")[:2]]
    with ServerThread(serve_config(artifact)) as running, \
            BertzooClient(f"127.0.0.1:{running.port}", timeout=60) as client:
        job = tmp_path / "job.json"
        job.write_text(json.dumps({"target": f"127.0.0.1:{running.port}", "proto": str(PROTO), "texts": texts,
                                   "pairs": pairs, "qa": questions}))
        done = subprocess.run(["node", str(NODE_CLIENT / "client.mjs"), str(job)], capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr
        node = json.loads(done.stdout)
        python = {
            "model_info": plain(client.model_info()),
            "sentiment": plain(client.sentiment(texts)),
            "paraphrase": plain(client.paraphrase(pairs)),
            "similarity": plain(client.similarity(pairs)),
            "qa": plain(client.qa(questions)),
            "embed": plain(client.embed(texts)),
        }
        for method, answer in python.items():
            assert_same(node[method], answer, method)
        streamed = node["sentiment_stream"]
        middle = len(texts) // 2
        assert [m["result"] for m in streamed] == ["response"] * middle + ["error"] + ["response"] * (len(texts) - middle)
        assert streamed[middle]["error"]["code"] == node["empty_unary"] == "INVALID_ARGUMENT"
        answered = [m["response"] for m in streamed if m["result"] == "response"]
        for text, message in zip(texts, answered, strict=True):
            assert_same(message, plain(client.sentiment([text])), f"stream {text!r}")

"""Generated and shipped files in step with their sources: the installed stubs with protos/, the dashboard with
the metrics."""

from __future__ import annotations

import importlib.resources
import importlib.util
import json
import re
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

from bertzoo.serving.metrics import Metrics
from bertzoo.serving.proto import pb2


def test_installed_stubs_are_generated_from_the_proto_in_this_tree(tmp_path):
    protoc = pytest.importorskip("grpc_tools.protoc")
    protos = Path(__file__).resolve().parents[1] / "protos"
    out = tmp_path / "descriptor.pb"
    assert protoc.main(["protoc", f"-I{protos}", f"--descriptor_set_out={out}", "bertzoo/v1/bertzoo.proto"]) == 0
    compiled = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file[0]
    installed = descriptor_pb2.FileDescriptorProto.FromString(pb2.DESCRIPTOR.serialized_pb)
    compiled.name = installed.name  # the stubs are compiled under their import path, bertzoo/serving/_proto/

    def drop_json_names(messages) -> None:  # a descriptor set records them, generated code does not
        for message in messages:
            for f in message.field:
                f.ClearField("json_name")
            drop_json_names(message.nested_type)

    drop_json_names(compiled.message_type)
    assert compiled == installed, "stale stubs: reinstall the package (pip install -e .) to regenerate them"


def test_the_dashboard_charts_every_metric_and_only_those():
    dashboard = json.loads((importlib.resources.files("bertzoo.serving") / "grafana" / "bertzoo-dashboard.json")
                           .read_text())
    charted = set(re.findall(r"(?:bertzoo|process)_[a-z_]+", " ".join(t["expr"] for p in dashboard["panels"]
                                                                     for t in p["targets"])))
    suffixes = {"histogram": ("_bucket", "_sum", "_count"), "counter": ("_total",), "gauge": ("",), "info": ("_info",)}
    families = {f.name: f.type for f in Metrics().registry.collect()}
    exported = {name + suffix for name, kind in families.items() for suffix in suffixes[kind]}
    assert charted <= exported, charted - exported
    # Every bertzoo metric is charted; of the process's, CPU, memory and file descriptors.
    ours = {name for name in families if name.startswith("bertzoo_")}
    assert {name for name in ours if not any(c.startswith(name) for c in charted)} == set()
    assert {"process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds"} <= charted

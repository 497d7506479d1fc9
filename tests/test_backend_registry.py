"""One table of backends (serving/backends' BACKENDS): serve's choices, its settings' checks and the factory all read
it, so a new backend is one module plus one entry."""

from __future__ import annotations

import sys

import pytest

from bertzoo.cli_serve import serve
from bertzoo.serving import config, machine_defaults
from bertzoo.serving.backends import BACKENDS, BackendUnavailable, check_available, create_backend


def _choices(name: str) -> list[str]:
    return list(next(p for p in serve.params if p.name == name).type.choices)


def test_the_cli_offers_exactly_the_tables_backends():
    assert _choices("backend") == ["auto", *BACKENDS]  # auto: serving/machine_defaults.py picks one of them
    assert set(BACKENDS) == {"onnxruntime", "openvino", "tensorrt", "torch"}


def test_device_and_precision_choices_are_every_value_some_backend_takes():
    assert _choices("device") == list(config.DEVICES)
    assert set(config.DEVICES) == {d for entry in BACKENDS.values() for d in entry.devices}
    assert _choices("precision") == list(config.PRECISIONS)
    assert set(config.PRECISIONS) == {p for e in BACKENDS.values() for v in e.precisions.values() for p in v}


def test_every_entry_is_complete():
    help_text = next(p for p in serve.params if p.name == "backend").help
    for name, entry in BACKENDS.items():
        assert entry.name == name and callable(entry.create)
        assert entry.requires and "pip install" in entry.install
        assert entry.devices and all(values[0] == "auto" for values in entry.precisions.values())
        assert entry.serves in ("artifact", "checkpoint") and entry.packages
        assert f"{name}: {entry.summary}" in help_text


def test_an_unknown_backend_is_refused_naming_the_table():
    with pytest.raises(ValueError, match="onnxruntime"):
        create_backend("tvm", "x")
    with pytest.raises(ValueError, match="backend must be one of"):
        config.ServeConfig("x", backend="tvm")


def test_a_device_the_entry_lacks_is_refused_before_any_import():
    with pytest.raises(BackendUnavailable, match="the openvino backend runs on the CPU only: drop --device cuda"):
        check_available("openvino", "cuda")
    with pytest.raises(BackendUnavailable, match="the tensorrt backend runs on a GPU only: add --device cuda"):
        check_available("tensorrt", "cpu")


def test_tensorrt_names_everything_missing_in_one_line(monkeypatch):
    """Without tensorrt, triton and a GPU (as on a CPU machine, made so on any): one refusal names all three and what
    to install, instead of one missing piece per attempt."""
    torch = pytest.importorskip("torch")
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # `import tensorrt` raises ImportError
    monkeypatch.setitem(sys.modules, "triton", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(BackendUnavailable) as refused:
        check_available("tensorrt", "cuda")
    line = str(refused.value)
    assert "\n" not in line and line.startswith("the tensorrt backend needs tensorrt (")
    assert "triton (" in line and "sees no CUDA GPU" in line and "pip install tensorrt triton" in line


def test_cpu_instances_follow_the_table(monkeypatch):
    monkeypatch.setattr(machine_defaults, "cores", lambda: 4)
    for name, entry in BACKENDS.items():
        if "cpu" in entry.devices:
            assert machine_defaults.instances(name, "cpu", None) == (4 if entry.cpu_instances else 1)

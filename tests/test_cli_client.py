"""`bertzoo client` and `bertzoo bench-serve` against a running server: answers, files of inputs, and errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from bertzoo.cli import main
from bertzoo.serving.client import BertzooClient


def test_cli_client_and_bench_serve(tiny_server, tmp_path):
    running, _ = tiny_server
    target = ["--target", f"127.0.0.1:{running.port}"]
    runner = CliRunner()
    result = runner.invoke(main, ["client", "sentiment", "a lovely film", *target])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["results"][0]["label"]
    result = runner.invoke(main, ["client", "qa", "Who went?", "Alice went to Paris.", *target])
    assert result.exit_code == 0 and "no_answer" in json.loads(result.output)["results"][0]
    result = runner.invoke(main, ["client", "sentiment", " ", *target])
    assert result.exit_code == 1 and "INVALID_ARGUMENT: texts[0] is empty" in result.output
    out = tmp_path / "bench.json"
    result = runner.invoke(main, ["bench-serve", *target, "--task", "similarity", "--requests", "30", "--concurrency",
                                  "3", "--items", "2", "--json-out", str(out)])
    assert result.exit_code == 0, result.output
    summary = json.loads(out.read_text())
    assert (summary["requests"], summary["ok"], summary["errors"]) == (30, 30, {})
    assert 0 < summary["p50_ms"] <= summary["p95_ms"] <= summary["p99_ms"] and summary["items_per_s"] > 0
    assert "throughput" in result.output and "p99" in result.output


def test_cli_client_answers_a_file_one_json_line_per_input_in_order(tiny_server, tmp_path):
    running, _ = tiny_server
    target = ["--target", f"127.0.0.1:{running.port}"]
    texts = tmp_path / "reviews.txt"
    # a blank line (skipped), and a text over the server's max_text_chars (refused alone)
    texts.write_text("\n".join(["a lovely film", "", "x", "a dull film", "y" * 20_001]) + "\n")
    out = tmp_path / "answers.jsonl"
    result = CliRunner().invoke(main, ["client", "sentiment", "--input", str(texts), "--output", str(out), *target])
    assert result.exit_code == 0, result.output
    answers = [json.loads(line) for line in out.read_text().splitlines()]
    assert [a["index"] for a in answers] == [0, 1, 2, 3]
    with BertzooClient(f"127.0.0.1:{running.port}") as client:
        expected = [client.sentiment([t]).results[0].label for t in ("a lovely film", "x", "a dull film")]
    assert [a["label"] for a in answers[:3]] == expected
    assert answers[3]["error"]["code"] == "INVALID_ARGUMENT" and "label" not in answers[3]  # failed alone, in place
    result = CliRunner().invoke(main, ["client", "embed", "--input", str(texts), *target])
    assert result.exit_code == 0
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(lines) == 4 and len(lines[0]["embedding"]) == client_dimensions(running)
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text('{"text_a": "a cat sat", "text_b": "a cat was sitting", "id": 7}\n\n{"text_a": "x", "text_b": "y"}\n')
    result = CliRunner().invoke(main, ["client", "similarity", "--input", str(pairs), *target])
    assert result.exit_code == 0, result.output
    scores = [json.loads(line)["score"] for line in result.stdout.splitlines()]
    with BertzooClient(f"127.0.0.1:{running.port}") as client:
        assert scores == pytest.approx([r.score for r in client.similarity([("a cat sat", "a cat was sitting"),
                                                                            ("x", "y")]).results], abs=1e-5)
    pairs.write_text('{"text_a": "a cat sat"}\n')
    result = CliRunner().invoke(main, ["client", "similarity", "--input", str(pairs), *target])
    assert result.exit_code == 1 and f"{pairs}:1: a similarity input is an object with the text fields text_a, text_b" \
        in result.output
    result = CliRunner().invoke(main, ["client", "sentiment", "more", "--input", str(texts), *target])
    assert result.exit_code == 2 and "--input FILE replaces TEXTS" in result.output
    missing_server = CliRunner().invoke(main, ["client", "sentiment", "--input", str(texts), "--output",
                                               str(tmp_path / "none.jsonl"), "--target", "127.0.0.1:1", "--timeout", "2"])
    assert missing_server.exit_code == 1 and not (tmp_path / "none.jsonl").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary file left


def test_cli_client_ends_quietly_when_its_reader_stops_early(tiny_server, tmp_path):
    """`bertzoo client embed --input FILE | head -1`: the pipe closed under it ends the client as it ends `yes`, with
    status 141 and nothing on stderr."""
    running, _ = tiny_server
    texts = tmp_path / "many.txt"
    texts.write_text("a lovely film\n" * 600)  # answers well past a pipe's buffer: writes go on after the close
    client = subprocess.Popen([sys.executable, "-m", "bertzoo", "client", "embed", "--input", str(texts), "--target",
                               f"127.0.0.1:{running.port}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        first = client.stdout.readline()
        client.stdout.close()  # what `head -1` does once it has its line
        err = client.stderr.read().decode()
        client.wait(timeout=120)
    finally:
        client.kill()
    assert json.loads(first)["index"] == 0
    assert "Broken pipe" not in err and "Error" not in err and err == "", err
    assert client.returncode == 141


def client_dimensions(running) -> int:
    with BertzooClient(f"127.0.0.1:{running.port}") as client:
        return client.model_info().embedding_dimensions

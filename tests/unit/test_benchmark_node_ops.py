"""benchmarks/node_ops.py runs and prints one JSON object whose figures hold together."""

from __future__ import annotations

import json

import pytest
from benchmarks import node_ops


def test_the_node_ops_benchmark_prints_its_figures(capsys: pytest.CaptureFixture[str]) -> None:
    assert node_ops.main(["--nodes", "6", "9", "--per-node", "4", "--repeat", "1"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["benchmark"] == "node_ops" and [s["nodes"] for s in result["sizes"]] == [6, 9]
    for size in result["sizes"]:
        assert size["instances"] == size["nodes"] * 4 and size["problems"] == 0
        assert 2 <= size["groups"] <= size["serial_rounds"] == size["nodes"]
        assert size["rounds_saved_x"] == round(size["nodes"] / size["groups"], 2)
        assert size["capacity_now"] >= size["capacity_n1"] > 0

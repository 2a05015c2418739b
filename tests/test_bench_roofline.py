"""bench/roofline.py (issue 56): a forward's FLOPs and bytes are what a hand count gives, attention included, a cell's
bound is the larger of its two terms, and a suite table is read cell by cell into the bound, the measured fractions
and the speed-up left at the bound."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from bench import roofline

H100 = "NVIDIA H100 80GB HBM3"


def test_an_mlps_flops_bytes_and_kernels_are_its_hand_count():
    mlp = lambda: nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))  # noqa: E731
    c = roofline.count(mlp, lambda: {"input": torch.randn(8, 64)})
    assert c.flops == 2 * 8 * (64 * 256 + 256 * 10)  # a multiply-add is 2 FLOPs
    assert c.weight_bytes == 2 * (64 * 256 + 256 + 256 * 10 + 10)  # weights and biases in bf16
    assert c.io_bytes == 4 * 8 * (64 + 10)  # the fp32 input and output
    assert (c.kernels, c.distinct_ops, c.uncounted) == (3, 2, ())  # addmm, relu, addmm: the transposes are views


class Attention(nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return nn.functional.scaled_dot_product_attention(q, k, v)


def test_attention_on_the_cpu_is_counted_as_the_counter_counts_it_on_a_gpu():
    b, h, s, d = 2, 4, 32, 16
    c = roofline.count(Attention, lambda: {n: torch.randn(b, h, s, d) for n in "qkv"})
    assert c.flops == 2 * (2 * b * h * s * s * d)  # q @ k^T and the weights @ v


def test_a_bound_is_the_larger_of_compute_and_memory():
    peak = roofline.peak_of(H100)
    compute_bound = roofline.Count(flops=int(989e9), weight_bytes=0, io_bytes=int(3.35e9 / 2), kernels=1,
                                   distinct_ops=1, uncounted=())
    assert roofline.bound_ms(compute_bound, peak) == (pytest.approx(1.0), "compute")
    memory_bound = roofline.Count(flops=int(989e9), weight_bytes=int(3.35e9), io_bytes=int(3.35e9), kernels=1,
                                  distinct_ops=1, uncounted=())
    assert roofline.bound_ms(memory_bound, peak) == (pytest.approx(2.0), "memory")


def suite_table(device: str = H100) -> dict:
    """A suite table as bench/suite.py writes it, with one model: lennard_jones at 1 and 1000."""
    def cell(auto: float, ref: float) -> dict:
        return {"auto": {"median_ms": auto}, "eager.bf16": {"median_ms": 0.4}, "reference.bf16": {"median_ms": ref},
                "reference_max_autotune.bf16-weights": {"median_ms": ref * 2}}
    row = {"model": "lennard_jones", "harness_batch_size": 1000, "eager": "eager.bf16", "batch_sizes": [1, 1000],
           "references": ["reference.bf16", "reference_max_autotune.bf16-weights"],
           "reference_modes": {"reference.bf16": "reduce-overhead",
                               "reference_max_autotune.bf16-weights": "max-autotune"},
           "cells": {"1": cell(0.1, 0.2), "1000": cell(0.1, 0.4)}}
    return {"device": device, "torch": "2.11.0+cu130", "precision": "[bf16]", "overrides": [], "smoke": False,
            "rows": [row, {"model": "phlippe_resnet", "not_run": "past --budget-s 400"}]}


def test_a_suite_table_becomes_each_cells_bound_and_what_is_left_over_the_reference(tmp_path):
    (tmp_path / "suite-x.json").write_text(json.dumps(suite_table()))
    roofline.main(["--suite", str(tmp_path / "suite-x.json"), "--out", str(tmp_path)])
    result = json.loads((tmp_path / "roofline-x.json").read_text())
    one, thousand = result["rows"]
    # TorchBench's lennard_jones as the suite builds it: Linear(1, 16), three Linear(16, 16), Linear(16, 1)
    per_sample = 2 * (1 * 16 + 3 * 16 * 16 + 16 * 1)
    assert one["gflop"] == pytest.approx(per_sample / 1e9)
    assert thousand["gflop"] == pytest.approx(1000 * per_sample / 1e9)
    weights = 2 * (16 + 3 * 16 * 16 + 16 + 4 * 16 + 1)
    assert thousand["mb"] == pytest.approx((weights + 4 * 1000 * 2) / 1e6)  # fp32 points in, energies out
    peak = roofline.PEAKS["H100 80GB HBM3"]
    bound = max(1000 * per_sample / peak.flops, (weights + 8000) / peak.bandwidth) * 1e3
    assert (thousand["bound_ms"], thousand["bound_by"]) == (pytest.approx(bound), "memory")
    assert thousand["reference"] == "reference.bf16" and thousand["reference_mode"] == "reduce-overhead"
    assert thousand["auto_of_bound"] == pytest.approx(bound / 0.1)
    assert thousand["speedup_at_bound"] == pytest.approx(0.4 / bound)
    assert thousand["auto_of_bound_for_target"] == pytest.approx(1.5 * bound / 0.4)  # 1.5x the reference's fraction
    summary = result["summary"]
    assert summary["all"]["speedup_over_reference"] == pytest.approx((2 * 4) ** 0.5)  # geomean of 0.2/0.1, 0.4/0.1
    assert summary["larger"]["cells"] == summary["batch_1"]["cells"] == 1
    assert result["not_measured"] == {"phlippe_resnet": "not run: past --budget-s 400"}
    md = (tmp_path / "roofline-x.md").read_text()
    assert "lennard_jones 9 ops (2 distinct)" in md and "Command: `python bench/roofline.py --suite" in md


def test_a_device_without_peak_figures_is_one_line_naming_the_fix(tmp_path, capsys):
    (tmp_path / "suite-a100.json").write_text(json.dumps(suite_table("NVIDIA A100-SXM4-80GB")))
    with pytest.raises(SystemExit) as exit_:
        roofline.main(["--suite", str(tmp_path / "suite-a100.json")])
    assert exit_.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "no peak figures for the device 'NVIDIA A100-SXM4-80GB'" in error and "add its dense bf16" in error

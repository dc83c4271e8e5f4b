"""The probe of fp32_precision=bf16 (autotune/worker/fpmath.py): its exact numbers tell what random ones show, on a CPU
whose oneDNN computes float32 matmuls in bfloat16 under it and on one that keeps them in float32."""

from __future__ import annotations

import json
import subprocess
import sys

import torch

from autotune.worker.fpmath import SHAPES, UNEVEN, bf16_changes_fp32_matmuls

# The largest error of a random matmul against float64, relative to its largest entry: float32 keeps 24 significant
# bits (errors near 1e-6 at these sizes), bfloat16 inputs keep 8 (errors near 2e-3). Set between the two formats.
BETWEEN_FLOAT32_AND_BFLOAT16 = 1e-4


def _relative_error_under_bf16(rows: int, inner: int, columns: int) -> float:
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(rows, inner, generator=generator)
    weight = torch.randn(columns, inner, generator=generator)
    exact = torch.nn.functional.linear(inputs.double(), weight.double())
    with torch.backends.flags(fp32_precision="bf16"):
        product = torch.nn.functional.linear(inputs, weight)
    return ((product.double() - exact).abs().max() / exact.abs().max()).item()


def test_the_probe_answers_what_a_random_matmul_shows_on_this_cpu():
    errors = [_relative_error_under_bf16(*shape) for shape in SHAPES]
    if bf16_changes_fp32_matmuls():
        assert max(errors) > BETWEEN_FLOAT32_AND_BFLOAT16, errors  # some shape ran in bfloat16
    else:
        assert max(errors) < BETWEEN_FLOAT32_AND_BFLOAT16, errors  # every shape stayed float32


def test_its_numbers_are_exact_in_float32_and_not_once_rounded_to_bfloat16():
    for rows, inner, columns in SHAPES:
        uneven, ones = torch.full((rows, inner), UNEVEN), torch.ones(columns, inner)
        exact = torch.full((rows, columns), inner * UNEVEN)
        assert torch.equal(torch.nn.functional.linear(uneven.double(), ones.double()).float(), exact)
        assert torch.equal(torch.nn.functional.linear(uneven.bfloat16().float(), ones), torch.full_like(exact, inner))


def test_it_runs_as_a_program_and_prints_its_answer():
    done = subprocess.run([sys.executable, "-m", "autotune.worker.fpmath"], capture_output=True, text=True, check=True)
    assert json.loads(done.stdout.splitlines()[-1]) == {"bf16_changes_fp32_matmuls": bf16_changes_fp32_matmuls()}

"""Whether fp32_precision=bf16 changes this CPU's float32 matmuls: python -m autotune.worker.fpmath prints the answer.

Under torch.backends.flags(fp32_precision="bf16") oneDNN may compute float32 matmuls in bfloat16, or keep them in
float32: which one depends on the CPU, its oneDNN and the matmul's shape, not on any flag torch exposes. So the probe
multiplies numbers whose float32 result is exact and whose bfloat16 result is not, at the shapes a model's decode
and prefill steps take. A float32 kernel of its own (another order of additions) cannot change an exact result;
rounding the inputs or the weights to bfloat16 always does.
"""

from __future__ import annotations

import json

import torch

UNEVEN = 1 + 2**-10  # exact in float32 (24 significant bits); 1.0 once rounded to bfloat16 (8 significant bits)
SHAPES = ((1, 256, 256), (16, 256, 256), (128, 512, 512))  # rows, inner, columns: a decode step, a short and a long
# prefill. Each product is UNEVEN or 1, so every partial sum j * UNEVEN (j <= inner) is exact in float32.


def bf16_changes_fp32_matmuls() -> bool:
    """Whether a float32 matmul under fp32_precision=bf16 comes out other than exact at any of the probe's shapes,
    with the uneven numbers in the inputs or in the weights (an implementation may round either)."""
    for rows, inner, columns in SHAPES:
        for inputs, weight in (
            (torch.full((rows, inner), UNEVEN), torch.ones(columns, inner)),
            (torch.ones(rows, inner), torch.full((columns, inner), UNEVEN)),
        ):
            with torch.backends.flags(fp32_precision="bf16"):
                product = torch.nn.functional.linear(inputs, weight)
            if not torch.equal(product, torch.full_like(product, inner * UNEVEN)):
                return True
    return False


def main() -> None:
    print(json.dumps({"bf16_changes_fp32_matmuls": bf16_changes_fp32_matmuls()}))


if __name__ == "__main__":
    main()

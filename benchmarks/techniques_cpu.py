"""Try each optimization technique of issue 16 on the demo model through plain transformers, on CPU.

Every technique runs in its own subprocess (a crash or a hang costs only its own row), with greedy
decoding on the bundled prompts, and prints one row: the API call, then `works` with what it did
(greedy tokens against the fp32 sdpa baseline, seconds) or `fails` with the exact error.

    python benchmarks/techniques_cpu.py                  # every technique, a markdown table
    python benchmarks/techniques_cpu.py --only spec-,kv- # the techniques whose name starts with spec- or kv-
    python benchmarks/techniques_cpu.py --run NAME       # one technique in this process, one JSON line
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PROMPT_COUNT = 3
INPUT_TOKENS = 48
NEW_TOKENS = 24
TIMEOUT_S = 480


@dataclass(frozen=True)
class Technique:
    api: str
    run: Callable[[Any], str]  # returns what happened; raises when the technique fails


class Context:
    """The demo model, the prompts, and the fp32 sdpa greedy baseline, loaded once per process."""

    def __init__(self) -> None:
        import torch
        from transformers import AutoTokenizer

        from autotune.data import load_prompts
        from autotune.paths import default_cache_dir
        from autotune.worker.demo_model import ensure_demo_model

        torch.manual_seed(0)
        self.inference_mode = True  # generate() under torch.inference_mode(), else under torch.no_grad()
        self.model_path = ensure_demo_model(default_cache_dir())
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        prompts = load_prompts()[:PROMPT_COUNT]
        self.prompts = [self.tokenizer(p, add_special_tokens=False)["input_ids"][:INPUT_TOKENS] for p in prompts]
        self.baseline = self.generate_each(self.load())

    def load(self, **kwargs: Any) -> Any:
        import torch
        from transformers import AutoModelForCausalLM

        kwargs.setdefault("dtype", torch.float32)
        kwargs.setdefault("attn_implementation", "sdpa")
        return AutoModelForCausalLM.from_pretrained(self.model_path, **kwargs).eval()

    def generate_each(self, model: Any, **kwargs: Any) -> list[list[int]]:
        """Greedy continuation of each prompt alone (batch 1, no padding)."""
        return [self._generate(model, [ids], **kwargs)[0] for ids in self.prompts]

    def generate_padded(self, model: Any, **kwargs: Any) -> list[list[int]]:
        """Greedy continuation of all prompts as one left-padded batch."""
        return self._generate(model, self.prompts, **kwargs)

    def _generate(self, model: Any, batch: list[list[int]], **kwargs: Any) -> list[list[int]]:
        import torch

        encoded = self.tokenizer.pad({"input_ids": batch}, return_tensors="pt", padding_side="left")
        with torch.inference_mode() if self.inference_mode else torch.no_grad():
            output = model.generate(
                **encoded,
                max_new_tokens=NEW_TOKENS,
                min_new_tokens=NEW_TOKENS,
                do_sample=False,
                pad_token_id=self.tokenizer.pad_token_id,
                **kwargs,
            )
        return output[:, encoded["input_ids"].shape[1] :].tolist()

    def agreement(self, outputs: list[list[int]]) -> str:
        """How many generated tokens equal the baseline's, and whether every sequence is identical."""
        same = sum(
            a == b for out, ref in zip(outputs, self.baseline, strict=True) for a, b in zip(out, ref, strict=True)
        )
        total = sum(len(ref) for ref in self.baseline)
        verdict = "identical to baseline" if outputs == self.baseline else "differs from baseline"
        return f"greedy {verdict} ({same}/{total} tokens)"


def timed(action: Callable[[], list[list[int]]]) -> tuple[list[list[int]], float]:
    start = time.perf_counter()
    outputs = action()
    return outputs, time.perf_counter() - start


def _speculative(**generate_kwargs: Any) -> Callable[[Context], str]:
    def run(ctx: Context) -> str:
        model = ctx.load()
        kwargs = dict(generate_kwargs)
        if kwargs.pop("assistant", False):
            kwargs["assistant_model"] = _draft(ctx)
        _, plain_s = timed(lambda: ctx.generate_each(model))
        outputs, spec_s = timed(lambda: ctx.generate_each(model, **kwargs))
        batched = _first_line_of_failure(lambda: ctx.generate_padded(model, **kwargs))
        return (
            f"batch 1: {ctx.agreement(outputs)}; {spec_s:.2f} s vs {plain_s:.2f} s plain. "
            f"Batch {PROMPT_COUNT}: {batched}"
        )

    return run


def _draft(ctx: Context) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    from autotune.paths import default_cache_dir
    from autotune.worker.demo_model import ensure_demo_draft

    return AutoModelForCausalLM.from_pretrained(ensure_demo_draft(default_cache_dir()), dtype=torch.float32).eval()


def _first_line_of_failure(action: Callable[[], object]) -> str:
    try:
        action()
    except Exception as error:
        return f"fails: {_error_line(error)}"
    return "works"


def _error_line(error: BaseException) -> str:
    message = str(error).strip().splitlines()
    return f"{type(error).__name__}: {message[0] if message else ''}"


def _sdpa_backend(name: str) -> Callable[[Context], str]:
    def run(ctx: Context) -> str:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        model = ctx.load()
        padded_baseline = ctx.generate_padded(model)
        with sdpa_kernel(getattr(SDPBackend, name)):
            single, seconds = timed(lambda: ctx.generate_each(model))
            padded = _first_line_of_failure(lambda: ctx.generate_padded(model))
            if padded == "works":
                same = ctx.generate_padded(model) == padded_baseline
                padded = f"{'identical to' if same else 'differs from'} the default backend's"
        return f"batch 1: {ctx.agreement(single)}, {seconds:.2f} s; left-padded batch {PROMPT_COUNT} (mask): {padded}"

    return run


def _quantized_weights(make_config: Callable[[], Any], dtype_name: str = "bfloat16") -> Callable[[Context], str]:
    def run(ctx: Context) -> str:
        import torch

        model = ctx.load(dtype=getattr(torch, dtype_name), quantization_config=make_config())
        outputs, seconds = timed(lambda: ctx.generate_each(model))
        kinds = sorted({type(module.weight).__name__ for module in model.modules() if hasattr(module, "weight")})
        return f"{ctx.agreement(outputs)} in {dtype_name}, {seconds:.2f} s; weight types {', '.join(kinds)}"

    return run


def _bfloat16(ctx: Context) -> str:
    import torch

    outputs, seconds = timed(lambda: ctx.generate_each(ctx.load(dtype=torch.bfloat16)))
    return f"{ctx.agreement(outputs)}, {seconds:.2f} s (what the weight-only rows in bfloat16 compare to)"


def _torchao(config_name: str, **options: Any) -> Callable[[], Any]:
    def make() -> Any:
        import torchao.quantization
        from transformers import TorchAoConfig

        return TorchAoConfig(getattr(torchao.quantization, config_name)(**options))

    return make


def _quanto(weights: str) -> Callable[[], Any]:
    def make() -> Any:
        from transformers import QuantoConfig

        return QuantoConfig(weights=weights)

    return make


def _without_inference_mode(run: Callable[[Context], str]) -> Callable[[Context], str]:
    def run_under_no_grad(ctx: Context) -> str:
        ctx.inference_mode = False
        return run(ctx)

    return run_under_no_grad


def _torchao_compiled(ctx: Context) -> str:
    import torch
    from transformers import CompileConfig

    model = ctx.load(dtype=torch.bfloat16, quantization_config=_torchao("Int8WeightOnlyConfig")())
    compile_config = CompileConfig(mode="default")
    compile_config._compile_all_devices = True  # generate() auto-compiles on CPU only with this set
    kwargs = {"cache_implementation": "static", "compile_config": compile_config}
    _, first_s = timed(lambda: ctx.generate_each(model, **kwargs))
    outputs, second_s = timed(lambda: ctx.generate_each(model, **kwargs))
    compiled = getattr(model, "_compiled_call", None) is not None
    return f"compiled: {compiled}; {ctx.agreement(outputs)}; first pass {first_s:.1f} s, second {second_s:.2f} s"


def _quantized_cache(backend: str, **options: Any) -> Callable[[Context], str]:
    def run(ctx: Context) -> str:
        model = ctx.load()
        cache_config = {"backend": backend, **options}
        outputs, seconds = timed(
            lambda: ctx.generate_each(model, cache_implementation="quantized", cache_config=cache_config)
        )
        return f"{ctx.agreement(outputs)}, {seconds:.2f} s"

    return run


def _continuous_batching(attn: str, **cb_options: Any) -> Callable[[Context], str]:
    def run(ctx: Context) -> str:
        from transformers import ContinuousBatchingConfig, GenerationConfig

        model = ctx.load(attn_implementation=attn)
        options = {"num_blocks": 16, "max_batch_tokens": 256, "page_size": 32, "auto_switch_to_flash": False}
        cb_config = ContinuousBatchingConfig(**{**options, **cb_options})
        generation_config = GenerationConfig(
            max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=-1
        )
        results, seconds = timed(
            lambda: model.generate_batch(
                ctx.prompts, generation_config=generation_config, continuous_batching_config=cb_config
            )
        )
        by_prompt = sorted(results.values(), key=lambda r: ctx.prompts.index(list(r.prompt_ids)))
        outputs = [list(r.generated_tokens)[:NEW_TOKENS] for r in by_prompt]
        used = model.config._attn_implementation
        return f"{ctx.agreement(outputs)}, {seconds:.2f} s; attention after the run: {used}"

    return run


def _kernels(ctx: Context) -> str:
    model = ctx.load(use_kernels=True)
    return f"{ctx.agreement(ctx.generate_each(model))}; {_hub_kernel_layers(model)}"


def _kernelize(use_fallback: bool) -> Callable[[Context], str]:
    def run(ctx: Context) -> str:
        from kernels import Mode, kernelize
        from transformers.integrations.hub_kernels import register_kernel_mapping_transformers

        register_kernel_mapping_transformers()  # the layer-to-hub-repo mapping transformers uses for use_kernels
        model = kernelize(ctx.load(), mode=Mode.INFERENCE, device="cpu", use_fallback=use_fallback)
        return f"{ctx.agreement(ctx.generate_each(model))}; {_hub_kernel_layers(model)}"

    return run


def _hub_kernel_layers(model: Any) -> str:
    """How many layers can take a hub kernel, and how many run something other than their own forward."""
    layers = [module for module in model.modules() if hasattr(type(module), "kernel_layer_name")]
    swapped = [m for m in layers if getattr(m.forward, "__func__", None) is not type(m).forward]
    names = sorted({type(m).kernel_layer_name for m in layers})
    return f"{len(layers)} kernel-capable layers ({', '.join(names)}), {len(swapped)} running a hub kernel"


def _tensor_parallel(ctx: Context) -> str:
    """Launch 2 gloo ranks with torchrun, each loading the model with tp_plan="auto"."""
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", "29516",
        __file__, "--tp-rank",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, env=_env(), cwd=REPO)
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or len(rows) != 2:
        raise RuntimeError(f"torchrun exit {done.returncode}: {_last_error_line(done.stderr)}")
    plain = ctx.agreement(rows[0]["outputs"])
    agree = rows[0]["outputs"] == rows[1]["outputs"]
    shard = rows[0]["shard"]
    return f"world size {rows[0]['world']}: rank 0 {plain}; ranks agree: {agree}; rank 0 holds q_proj {shard}"


def _tp_rank() -> None:
    import torch.distributed as dist

    ctx = Context()  # the baseline is computed on each rank before the tensor-parallel load
    model = ctx.load(tp_plan="auto")
    outputs = ctx.generate_each(model)
    weight = model.model.layers[0].self_attn.q_proj.weight
    local = weight.to_local() if hasattr(weight, "to_local") else weight
    row = {"outputs": outputs, "world": dist.get_world_size(), "shard": f"{list(local.shape)} of {list(weight.shape)}"}
    print(json.dumps(row), flush=True)
    dist.destroy_process_group()


def _last_error_line(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line or "error" in line]
    return (errors or lines or ["(no output)"])[-1][:400]


TECHNIQUES: dict[str, Technique] = {
    "spec-prompt-lookup": Technique("generate(prompt_lookup_num_tokens=10)", _speculative(prompt_lookup_num_tokens=10)),
    "spec-assistant": Technique(
        "generate(assistant_model=demo-draft, num_assistant_tokens=5)",
        _speculative(assistant=True, num_assistant_tokens=5),
    ),
    "spec-early-exit": Technique("generate(assistant_early_exit=2)", _speculative(assistant_early_exit=2)),
    **{
        f"sdpa-{name.lower()}": Technique(f"with sdpa_kernel(SDPBackend.{name}): generate()", _sdpa_backend(name))
        for name in ("MATH", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "OVERRIDEABLE")
    },
    "reference-bfloat16": Technique("from_pretrained(dtype=torch.bfloat16)", _bfloat16),
    "torchao-int8": Technique(
        "TorchAoConfig(Int8WeightOnlyConfig())", _quantized_weights(_torchao("Int8WeightOnlyConfig"))
    ),
    "torchao-int4": Technique(
        "TorchAoConfig(Int4WeightOnlyConfig(group_size=32))",
        _quantized_weights(_torchao("Int4WeightOnlyConfig", group_size=32)),
    ),
    **{
        f"torchao-int4-{packing}": Technique(
            f'TorchAoConfig(Int4WeightOnlyConfig(group_size=32, int4_packing_format="{packing}"))',
            _quantized_weights(_torchao("Int4WeightOnlyConfig", group_size=32, int4_packing_format=packing)),
        )
        for packing in ("tile_packed_to_4d", "plain_int32", "opaque")
    },
    "torchao-fp8": Technique(
        "TorchAoConfig(Float8WeightOnlyConfig())", _quantized_weights(_torchao("Float8WeightOnlyConfig"))
    ),
    "torchao-int8-compile": Technique(
        "TorchAoConfig(Int8WeightOnlyConfig()) + static cache + compile", _torchao_compiled
    ),
    **{
        f"quanto-{weights}": Technique(
            f'QuantoConfig(weights="{weights}")', _quantized_weights(_quanto(weights), "float32")
        )
        for weights in ("int8", "int4", "float8")
    },
    "quanto-int4-no-grad": Technique(
        'QuantoConfig(weights="int4"), generate() under no_grad, not inference_mode',
        _without_inference_mode(_quantized_weights(_quanto("int4"), "float32")),
    ),
    "kv-quanto": Technique(
        'cache_implementation="quantized", cache_config={"backend": "quanto", "nbits": 4, "residual_length": 8}',
        _quantized_cache("quanto", nbits=4, residual_length=8),
    ),
    "kv-hqq": Technique(
        'cache_implementation="quantized", cache_config={"backend": "hqq", "nbits": 4, "residual_length": 8}',
        _quantized_cache("hqq", nbits=4, residual_length=8),
    ),
    "kv-fp8": Technique('cache_implementation="quantized", cache_config={"backend": "fp8"}', _quantized_cache("fp8")),
    **{
        f"cb-{attn.replace('|', '-')}": Technique(
            f'generate_batch(), attn_implementation="{attn}"', _continuous_batching(attn)
        )
        for attn in ("sdpa", "eager", "paged|eager", "paged|sdpa", "flex_attention")
    },
    "cb-sdpa-page16": Technique("generate_batch(), sdpa, page_size=16", _continuous_batching("sdpa", page_size=16)),
    "cb-sdpa-async": Technique(
        "generate_batch(), sdpa, use_async_batching=True", _continuous_batching("sdpa", use_async_batching=True)
    ),
    "cb-sdpa-cuda-graph": Technique(
        "generate_batch(), sdpa, use_cuda_graph=True", _continuous_batching("sdpa", use_cuda_graph=True)
    ),
    "cb-sdpa-compile": Technique(
        "generate_batch(), sdpa, default_compile_level=1", _continuous_batching("sdpa", default_compile_level=1)
    ),
    "use-kernels": Technique("from_pretrained(use_kernels=True), HF_HUB_OFFLINE=1", _kernels),
    "kernelize": Technique("kernels.kernelize(model, mode=Mode.INFERENCE, device='cpu')", _kernelize(True)),
    "kernelize-no-fallback": Technique(
        "kernels.kernelize(model, mode=Mode.INFERENCE, device='cpu', use_fallback=False)", _kernelize(False)
    ),
    "tp-auto-gloo": Technique('torchrun --nproc-per-node 2: from_pretrained(tp_plan="auto")', _tensor_parallel),
}


def run_one(name: str) -> dict[str, str]:
    technique = TECHNIQUES[name]
    try:
        ctx = Context()
    except Exception as error:
        return {"result": f"setup fails: {_error_line(error)}"}
    start = time.perf_counter()
    try:
        what = technique.run(ctx)
    except Exception as error:
        traceback.print_exc()
        return {"result": f"fails: {_error_line(error)}"}
    return {"result": f"works: {what} [{time.perf_counter() - start:.0f} s]"}


def _env() -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO))
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("OMP_NUM_THREADS", "1")  # one thread per process: the timings compare, the cores are shared
    return env


def run_isolated(name: str) -> str:
    command = [sys.executable, __file__, "--run", name]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, env=_env(), cwd=REPO)
    except subprocess.TimeoutExpired:
        return f"fails: no answer within {TIMEOUT_S} s"
    rows = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not rows:
        return f"crashed (exit {done.returncode}): {_last_error_line(done.stderr)}"
    result = json.loads(rows[-1])["result"]
    if "CONVERSION" in result:  # transformers logs why each weight failed to convert and raises a summary
        lines = re.findall(r"^(\w+(?:Error|Exception): .*)$", done.stderr, flags=re.MULTILINE)
        causes = [line for line in lines if "CONVERSION" not in line]
        result += f" Cause logged: {causes[0]}" if causes else ""
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated name prefixes of the techniques to run")
    parser.add_argument("--run", choices=sorted(TECHNIQUES), help="run one technique in this process")
    parser.add_argument("--tp-rank", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.tp_rank:
        _tp_rank()
        return
    if args.run:
        print(json.dumps(run_one(args.run)), flush=True)
        return
    import torch
    import transformers

    print(f"transformers {transformers.__version__}, torch {torch.__version__}, CPU\n")
    print("| technique | API call | result |\n|---|---|---|", flush=True)
    for name, technique in TECHNIQUES.items():
        if name.startswith(tuple(args.only.split(","))):
            print(f"| {name} | `{technique.api}` | {run_isolated(name)} |", flush=True)


if __name__ == "__main__":
    main()

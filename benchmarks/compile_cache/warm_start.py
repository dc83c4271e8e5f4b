"""A study's compiles cold, then a study warm-started from it on a fresh machine: compile time trial by trial.

    python benchmarks/compile_cache/warm_start.py --out DIR [--trials 8] [--batch-size 4] [--dtypes bfloat16]
        [--attentions sdpa] [-- more search flags]

In DIR: a space whose configurations compile (float32 or bfloat16, sdpa or eager, static cache, compile default; or the
dtypes and attentions given), then
`autotune search --study cold`, then `autotune search --study warm --warm-start cold`, both in DIR/studies/compile.db,
each with an autotune cache folder of its own holding only the demo model (copied from $AUTOTUNE_CACHE_DIR, default
.cache/autotune) and an empty temporary folder: two fresh machines. Prints each compiling trial's configuration, cold or
warm, torch's compile seconds and its first calls (one per batch of a capacity probe), then the totals.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

import optuna

SPACE = """knobs:
  dtype: [{dtypes}]
  attn_implementation: [{attentions}]
  cache_implementation: [static]
  compile:
    values: [default]
    when: {{cache_implementation: static}}
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--trials", default="8")
    parser.add_argument("--batch-size", default="4")
    parser.add_argument("--dtypes", default="float32, bfloat16")
    parser.add_argument("--attentions", default="sdpa, eager")
    parser.add_argument("flags", nargs="*", help="more flags for both searches")
    args = parser.parse_args()
    out = args.out.resolve()
    if out.exists():
        shutil.rmtree(out)
    (out / "studies").mkdir(parents=True)
    (out / "space.yaml").write_text(SPACE.format(dtypes=args.dtypes, attentions=args.attentions))
    models = Path(os.environ.get("AUTOTUNE_CACHE_DIR", ".cache/autotune")).resolve() / "models"
    storage = f"sqlite:///{out}/studies/compile.db"
    common = ["--model", "demo", "--gpu", "cpu", "--space", "space.yaml", "--seed", "1", "--trials", args.trials,
              "--batch-size", args.batch_size, "--storage", storage, *args.flags]  # fmt: skip
    for study, more in (("cold", []), ("warm", ["--warm-start", "cold"])):
        machine = out / f"machine-{study}"
        (machine / "tmp").mkdir(parents=True)
        shutil.copytree(models, machine / "cache" / "models")
        env = {**os.environ, "AUTOTUNE_CACHE_DIR": str(machine / "cache"), "TMPDIR": str(machine / "tmp")}
        with (out / f"{study}.log").open("w") as log:
            command = [sys.executable, "-m", "autotune", "search", *common, "--study", study, *more]
            subprocess.run(command, cwd=out, env=env, stdout=log, stderr=subprocess.STDOUT, check=True)
    for study in ("cold", "warm"):
        report(optuna.load_study(study_name=study, storage=f"sqlite:///{out}/studies/compile.db"))
        print("  " + next(line for line in (out / f"{study}.log").read_text().splitlines() if line.startswith("time")))


def report(study: optuna.Study) -> None:
    total = 0.0
    print(f"study {study.study_name}")
    for trial in study.get_trials():
        compiled = trial.user_attrs.get("compile")
        if not compiled:
            continue
        config = trial.user_attrs["config"]
        points = (trial.user_attrs.get("capacity") or {}).get("points", [])
        first_calls = [round(p["figures"]["first_call_s"], 1) for p in points if "first_call_s" in p.get("figures", {})]
        first_calls = first_calls or [round(trial.user_attrs["metrics"]["first_call_s"], 1)]
        total += compiled["seconds"]
        print(f"  #{trial.number} {config['dtype']} {config['attn_implementation']}: {compiled['cache']}, "
              f"torch compiled {compiled['seconds']:.1f} s, first calls {first_calls} s")  # fmt: skip
    print(f"  total torch compile time {total:.1f} s")


if __name__ == "__main__":
    main()

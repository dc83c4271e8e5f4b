"""Tier 1: one configuration evaluated on a task through lm-evaluation-harness, with the model loaded and generating as
its plan says: its dtype, attention, quantization and compile from the plan's from_pretrained, and every generate()
call of the harness given the plan's generate() arguments (cache and its backend, compile config, decoding loop) inside
the plan's context managers. Each item's answer, right or wrong, goes back to the study, which sets it against the
reference's (autotune/figures/task.py).

`demo` is a task built here from the demo model's bundled corpus (autotune/data/corpus.txt): the first half of a
verse after the verse before it, and the next three words to say; the demo model learned the corpus for a few hundred
steps, so it knows some of them. A task name is one of lm-evaluation-harness's, and a folder holds task YAML files. A
task the harness cannot load here (its data needs a download this machine cannot make, or no such task) is
EvaluationTaskError: one line naming it. Loglikelihood tasks run a forward pass of the loaded model, not its decoding
path.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
from pathlib import Path
from typing import Any

import yaml

from autotune import for_tests
from autotune.data import CORPUS
from autotune.figures.quality import DECODE, GENERATE
from autotune.process.results import Answers, Outcome, TaskDetails, TaskResult, TaskSpec
from autotune.space import rules
from autotune.space.plan import Plan
from autotune.worker import hooks
from autotune.worker.environment import environment
from autotune.worker.extensions import build_library_extensions
from autotune.worker.generation import entered
from autotune.worker.generation_trial import refuse_what_cannot_run
from autotune.worker.loading import load_model, load_tokenizer, materialize
from autotune.worker.tasks import Phases

DEMO = "demo"
DEMO_TASK = "autotune_demo"
DEMO_WORDS_SHOWN = 0.5  # the share of a verse's words the prompt gives
DEMO_MIN_WORDS = 8
DEMO_CONTEXT = 1  # verses before each item's verse (the demo model learned 64-token windows)
DEMO_ANSWER_WORDS = 3  # the words to say next: several tokens, so all but the first come through the decoding path
TASK_PHASE = "task"  # the phase of an evaluation whose task cannot be loaded here (bad input)


class EvaluationTaskError(Exception):
    """The task cannot be evaluated here: bad input, said in one line."""


def run(spec: TaskSpec, phases: Phases) -> TaskResult:
    """Load the configuration as its plan says and answer every item of the task; a task that cannot be loaded here
    is one line, not a traceback."""
    try:
        return _evaluate(spec, phases)
    except EvaluationTaskError as error:
        return TaskResult(Outcome.ERROR, str(error), phase=TASK_PHASE)


def _evaluate(spec: TaskSpec, phases: Phases) -> TaskResult:
    assert spec.candidate is not None and spec.evaluation is not None
    plan = spec.candidate.plan
    with phases("load"):
        refuse_what_cannot_run(spec.candidate.config, plan)
        tokenizer = load_tokenizer(spec.model)
        for requirement in rules.requirements(spec.candidate.config):
            importlib.import_module(requirement.import_name)
        build_library_extensions(spec.device)
        model = load_model(spec.model, plan, spec.device)
    for_tests.model_loaded(spec.fault, model)  # a fault planted as in the trial
    with phases("evaluate"):
        task_names, manager = _tasks(spec.evaluation.task, Path(spec.cache_dir))
        answers, metric = answer(model, tokenizer, plan, spec, task_names, manager)
    path = GENERATE if plan.batching == "continuous" else DECODE
    details = TaskDetails(evaluation=Answers(spec.evaluation.task, metric, answers, path))
    return TaskResult(Outcome.OK, environment=environment(spec.device), details=details)


def answer(
    model: Any, tokenizer: Any, plan: Plan, spec: TaskSpec, task_names: list[str], manager: Any
) -> tuple[dict[str, bool], str]:
    """Each item's answer (right or wrong) by "<task>/<item>", and the metric that judged it."""
    from lm_eval.evaluator import evaluate
    from lm_eval.tasks import get_task_dict

    try:
        task_dict = get_task_dict(task_names, manager)
    except Exception as error:  # a download this machine cannot make, an unknown name, a YAML the harness refuses
        raise EvaluationTaskError(_cannot_load(spec.evaluation.task, error)) from None  # type: ignore[union-attr]
    harness_model = planned_model(model, tokenizer, plan, spec.workload.batch_size)
    limit = spec.evaluation.limit  # type: ignore[union-attr]
    results = evaluate(harness_model, task_dict, limit=limit, log_samples=True, bootstrap_iters=0, verbosity="WARNING")
    return _answers(results["samples"], task_dict)


def _cannot_load(task: str, error: BaseException) -> str:
    first = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
    return (
        f"--eval {task}: lm-evaluation-harness could not load the task here ({type(error).__name__}: {first}); "
        "a task whose data needs a download needs a machine that can make it, or a folder of task YAML files "
        "with local data (dataset_path: json)"
    )


def planned_model(model: Any, tokenizer: Any, plan: Plan, batch_size: int) -> Any:
    """The harness's HF model around the loaded model, whose every generate() call runs as the plan says."""
    from lm_eval.models.huggingface import HFLM

    class PlannedLM(HFLM):
        def _model_generate(self, context: Any, max_length: int, stop: list[str], **generation_kwargs: Any) -> Any:
            with entered(plan.contexts):
                return super()._model_generate(context, max_length, stop, **{**arguments, **generation_kwargs})

    arguments = materialize(plan.generate) | hooks.generate_arguments(plan)  # once: a new CompileConfig would recompile
    return PlannedLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size)


def _answers(samples: dict[str, list[dict[str, Any]]], task_dict: dict[str, Any]) -> tuple[dict[str, bool], str]:
    """Right or wrong per item, by the task's first metric and its first filter."""
    tasks = {task.config.task: task for task in _task_objects(task_dict)}
    answers: dict[str, bool] = {}
    metrics = []
    for task_name, task_samples in samples.items():
        metric = next(iter(tasks[task_name].aggregation()))
        metrics.append(metric)
        first_filter = task_samples[0].get("filter") if task_samples else None
        for sample in task_samples:
            if sample.get("filter") == first_filter:
                answers[f"{task_name}/{sample['doc_id']}"] = float(sample[metric]) > 0
    return answers, ", ".join(dict.fromkeys(metrics))


def _task_objects(task_dict: dict[str, Any]) -> list[Any]:
    """The harness's tasks in a task dict, groups opened."""
    found = []
    for value in task_dict.values():
        found += _task_objects(value) if isinstance(value, dict) else [value]
    return found


# ------------------------------------------------------------------------------------------------ the tasks


def _tasks(task: str, cache_dir: Path) -> tuple[list[str], Any]:
    """The harness's task names and its task manager: the demo task built in the cache, a folder's YAML files, or a
    task of the harness's own."""
    from lm_eval.tasks import TaskManager

    if task == DEMO:
        folder = demo_task_folder(cache_dir)
        return [DEMO_TASK], TaskManager(include_path=str(folder), include_defaults=False, verbosity="ERROR")
    folder = Path(task).expanduser()
    if folder.is_dir():
        names = [_task_name(path) for path in sorted(folder.glob("*.yaml"))]
        if not any(names):
            raise EvaluationTaskError(f"--eval {task}: the folder holds no task YAML file (a file with a task: name)")
        manager = TaskManager(include_path=str(folder), include_defaults=False, verbosity="ERROR")
        return [name for name in names if name], manager
    return [task], TaskManager(verbosity="ERROR")


def _task_name(path: Path) -> str | None:
    try:
        loaded = yaml.safe_load(path.read_text())
    except yaml.YAMLError:
        return None
    return loaded.get("task") if isinstance(loaded, dict) else None


def demo_items() -> list[dict[str, str]]:
    """Each verse of the corpus with at least DEMO_MIN_WORDS words: the verse before it and its first words, and the
    next DEMO_ANSWER_WORDS words. An answer's first token comes from the prefill; the rest are decoded through the
    cache (a quantized cache holds the prompt quantized), as a deployment decodes."""
    verses = [line.strip() for line in CORPUS.read_text().splitlines() if line.strip()]
    items = []
    for index in range(DEMO_CONTEXT, len(verses)):
        words = verses[index].split()
        if len(words) < DEMO_MIN_WORDS:
            continue
        shown = int(len(words) * DEMO_WORDS_SHOWN)
        context = "\n".join(verses[index - DEMO_CONTEXT : index])
        answer = " ".join(word.strip(".,;:!?") for word in words[shown : shown + DEMO_ANSWER_WORDS])
        items.append({"prompt": f"{context}\n{' '.join(words[:shown])}", "answer": answer})
    return items


def demo_task_folder(cache_dir: Path) -> Path:
    """The demo task's YAML and data, written once per corpus into the cache."""
    items = demo_items()
    digest = hashlib.sha256(json.dumps(items).encode()).hexdigest()[:12]
    folder = cache_dir / "eval-tasks" / f"demo-{digest}"
    data = folder / "demo.jsonl"
    if not data.exists():
        folder.mkdir(parents=True, exist_ok=True)
        _write(folder / "demo.yaml", yaml.safe_dump(_demo_yaml(data), sort_keys=False))
        _write(data, "".join(json.dumps(item) + "\n" for item in items))
    return folder


def _demo_yaml(data: Path) -> dict[str, Any]:
    return {
        "task": DEMO_TASK,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(data)}},
        "test_split": "test",
        "output_type": "generate_until",
        "doc_to_text": "{{prompt}}",
        "doc_to_target": "{{answer}}",
        "target_delimiter": " ",
        "generation_kwargs": {"until": ["\n"], "max_gen_toks": 16, "do_sample": False},
        "filter_list": [
            {
                "name": "first_words",
                "filter": [
                    {"function": "regex", "regex_pattern": r"^\s*([A-Za-z']+(?:[^A-Za-z'\n]+[A-Za-z']+){0,2})"},
                    {"function": "take_first"},
                ],
            }
        ],
        "metric_list": [
            {
                "metric": "exact_match",
                "aggregation": "mean",
                "higher_is_better": True,
                "ignore_case": True,
                "ignore_punctuation": True,
            }
        ],
        "metadata": {"version": 1.0},
    }


def _write(path: Path, text: str) -> None:
    staging = path.with_name(f".{path.name}.{os.getpid()}")
    staging.write_text(text)
    staging.replace(path)

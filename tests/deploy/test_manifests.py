"""deploy/: the Kubernetes manifests checked offline against the API schemas kubernetes-validate ships
(strict: an unknown field fails), the Dockerfile against the install steps CI runs, the scripts' syntax."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tests.conftest import REPO

MANIFESTS = sorted((REPO / "deploy" / "kubernetes").glob("*.yaml"))
# The oldest API with every field the manifests use (Indexed Job with backoffLimitPerIndex, GA in 1.33) and
# the newest the library knows.
VERSIONS = ("1.33.0", kubernetes_validate.latest_version())


def documents(path: Path) -> list[dict]:
    return [document for document in yaml.safe_load_all(path.read_text()) if document]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", MANIFESTS, ids=lambda path: path.name)
def test_manifest_is_valid_against_the_kubernetes_api(path: Path, version: str):
    found = documents(path)
    assert found, f"{path.name} holds no document"
    for document in found:
        kubernetes_validate.validate(document, version, strict=True)  # raises on a field the API does not know


def test_the_manifests_hold_what_the_deployment_needs():
    kinds = {(d["kind"], d["metadata"]["name"]): d for path in MANIFESTS for d in documents(path)}
    workers = kinds[("Job", "autotune-workers")]["spec"]
    assert workers["completionMode"] == "Indexed" and workers["completions"] == workers["parallelism"]
    container = workers["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["args"][:2] == ["worker", "--study"] and "--artifacts" in container["args"]
    assert ("StatefulSet", "autotune-db") in kinds and ("Service", "autotune-db") in kinds
    nightly = kinds[("CronJob", "autotune-nightly")]["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert nightly["containers"][0]["command"] == ["autotune-nightly"]
    storages = [env for d in kinds.values() for env in _envs(d) if env["name"] == "AUTOTUNE_STORAGE"]
    secret = {"name": "autotune-db", "key": "url"}
    assert len(storages) == 3 and all(env["valueFrom"]["secretKeyRef"] == secret for env in storages)


def _envs(document: dict) -> list[dict]:
    """The environment of the pods a Job, CronJob or StatefulSet starts."""
    spec = document.get("spec", {})
    template = spec.get("jobTemplate", {}).get("spec", spec).get("template")
    return [env for c in template["spec"]["containers"] for env in c.get("env", [])] if template else []


def test_a_wrong_field_fails_the_validation():
    workers = documents(REPO / "deploy" / "kubernetes" / "workers.yaml")[0]
    workers["spec"]["template"]["spec"]["containers"][0]["resource"] = {"limits": {"nvidia.com/gpu": 1}}  # typo
    with pytest.raises(kubernetes_validate.ValidationError, match="resource"):
        kubernetes_validate.validate(workers, VERSIONS[-1], strict=True)


def test_the_dockerfile_installs_as_ci_does():
    dockerfile = (REPO / "Dockerfile").read_text()
    makefile = (REPO / "Makefile").read_text()
    torch = re.search(r"^TORCH \?= (\S+)$", makefile, re.MULTILINE)
    assert torch and f"ARG TORCH={torch.group(1)}" in dockerfile  # the same pinned torch as CI's make
    ci_extras = set(re.search(r'-e "\.\[([^\]]+)\]" -c constraints\.txt', makefile).group(1).split(","))
    extras = set(re.search(r"^ARG EXTRAS=(\S+)$", dockerfile, re.MULTILINE).group(1).split(","))
    assert "postgres" in extras and extras <= ci_extras  # every extra the image installs, CI installs too
    assert 'pip install --no-cache-dir ".[$EXTRAS]" -c constraints.txt' in dockerfile
    assert "COPY deploy/nightly.sh /usr/local/bin/autotune-nightly" in dockerfile


@pytest.mark.parametrize("script", ["deploy/nightly.sh", "deploy/slurm/autotune-workers.sbatch"])
def test_scripts_parse(script: str):
    checked = subprocess.run(["bash", "-n", str(REPO / script)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr

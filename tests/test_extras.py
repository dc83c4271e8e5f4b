"""A feature behind an extra, asked for where its packages are missing: one line naming the extra.

The real missing case (a clean venv with `pip install .` alone) is run by .ci/core-install.sh; here every
package is installed, so a missing one is either a module that does not exist or `installed` answering no.
"""

import subprocess
import sys

import pytest

from autotune import extras
from autotune.errors import UserError
from autotune.extras import Package, why_missing, why_storage_missing
from autotune.measure.prepare import runnable_space
from autotune.paths import PACKAGED_SPACE
from autotune.profiles import PROFILES
from autotune.search.session import uninstalled_notes
from autotune.space import Target, load_space
from autotune.validate import check_storage
from tests.conftest import REPO


def test_a_missing_package_is_one_line_naming_the_extra_and_finding_it_imports_nothing():
    absent = Package("autotune_has_no_such_module", "no-such-package", "quant")
    assert why_missing("quantization=torchao-int8", [absent]) == (
        'quantization=torchao-int8 needs no-such-package, which is not installed: pip install "autotune[quant]"'
    )
    assert why_missing("--workload serve", [Package("json", "json", "serve")]) is None
    assert not extras.installed("autotune_has_no_such_module.child")  # a missing parent is no error


def test_looking_for_a_package_imports_neither_it_nor_torch():
    """The study process never imports torch; torchao and optimum-quanto would."""
    probe = (
        "import sys; from autotune.extras import installed; "
        "assert installed('torchao') and installed('optimum.quanto'); "
        "assert not {'torch', 'torchao', 'optimum'} & set(sys.modules), sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", probe], cwd=REPO, check=True, timeout=60)


def _without(monkeypatch, *modules: str) -> None:
    installed = extras.installed
    monkeypatch.setattr(extras, "installed", lambda module: module not in modules and installed(module))


def test_values_whose_packages_are_missing_leave_the_space_with_the_line_as_their_reason(monkeypatch):
    _without(monkeypatch, "torchao", "hqq")
    space = runnable_space(load_space(PACKAGED_SPACE), PROFILES["cpu"], Target("cpu"))
    assert space.removed["quantization"]["torchao-int8"] == (
        'quantization=torchao-int8 needs torchao, which is not installed: pip install "autotune[quant]"'
    )
    assert (
        "torchao-int8" not in space.knob("quantization").values and "quanto-int8" in space.knob("quantization").values
    )
    assert "hqq" not in space.knob("kv_cache_backend").values
    assert "CUDA" in space.removed["quantization"]["torchao-int4"]  # the hardware's reason, looked at first
    assert uninstalled_notes(space) == [
        "not searched, their packages are not installed here: quantization=torchao-int8, torchao-fp8; "
        'kv_cache_backend=hqq (pip install "autotune[quant]")'
    ]


def test_a_postgresql_storage_without_its_driver_is_bad_input_naming_the_extra(monkeypatch):
    _without(monkeypatch, "psycopg", "psycopg2")
    with pytest.raises(UserError, match=r'^--storage postgresql\+psycopg:// needs psycopg, .*"autotune\[postgres\]"$'):
        check_storage("postgresql+psycopg://tuner@db/studies")
    assert why_storage_missing("postgresql://tuner@db/studies") == (
        '--storage postgresql:// needs psycopg (or psycopg2), which is not installed: pip install "autotune[postgres]"'
    )
    assert why_storage_missing("sqlite:///studies/demo-cpu.db") is None

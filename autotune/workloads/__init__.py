"""The workload kinds, one module each, registered as they are imported (docs/adding-a-workload.md).

The order of the import below is the registry's: the order `--workload` lists the kinds in.
"""

# isort: off
from autotune.workloads import throughput, latency, serve  # noqa: F401 - imported to register them

# isort: on
from autotune.workloads.base import (
    DEFAULT_KIND,
    KINDS,
    DetailsTable,
    Flag,
    KindDetails,
    WorkloadKind,
    describe_workload,
    details_of,
    details_written,
    foreign_flags,
    kind_flags,
    metrics_of_one_kind,
    register,
    slo_target,
    workload_as_run,
    workload_kind,
)

__all__ = [
    "DEFAULT_KIND",
    "KINDS",
    "DetailsTable",
    "Flag",
    "KindDetails",
    "WorkloadKind",
    "describe_workload",
    "details_of",
    "details_written",
    "foreign_flags",
    "kind_flags",
    "metrics_of_one_kind",
    "register",
    "slo_target",
    "workload_as_run",
    "workload_kind",
]

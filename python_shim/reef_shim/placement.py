"""Pure placement planning: a layout becomes the placement groups Ray will be asked for.

No Ray here, so every rule is table-tested (python_shim/tests/test_placement.py). The Ray side
(`ray_driver.py`) only turns a plan into `ray.util.placement_group` calls.
"""

from __future__ import annotations

from typing import Any

from .errors import ShimError
from .messages import LAYOUT, PLAN

TRAINER_GROUP = "reef-trainer"
ROLLOUT_GROUP = "reef-rollout"
STUDENT_GROUP = "reef-student"
PRM_GROUP_PREFIX = "reef-prm-"
GROUP_PREFIX = "reef-"
# Colocated, the trainer's rank and the rollout engine each take this share of the trainer bundle's
# GPU and CPUs (Ray hands both the same GPU: the bundle holds one).
COLOCATED_SHARE = 0.5


def prm_group(index: int) -> str:
    return f"{PRM_GROUP_PREFIX}{index}"


def fmt_number(x: float) -> str:
    """1.0 -> '1', 0.5 -> '0.5': resource amounts read the way a user wrote them."""
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def bundle_label(group: str, index: int, resources: dict[str, float]) -> str:
    """`reef-student bundle 0 {GPU:1, CPU:1}`: how errors and progress logs name a bundle."""
    inner = ", ".join(f"{k}:{fmt_number(v)}" for k, v in resources.items())
    return f"{group} bundle {index} {{{inner}}}"


def _invalid(path: str, rule: str, value: Any) -> ShimError:
    return ShimError("REEF_ERR_INVALID_ARGUMENT", f"layout.{path} must be {rule}, got {value}")


def _check_values(layout: dict[str, Any]) -> None:
    if layout["trainer"]["gpus"] < 1:
        raise _invalid("trainer.gpus", "at least 1", layout["trainer"]["gpus"])
    if layout["rollout"]["gpus"] < 1:
        raise _invalid("rollout.gpus", "at least 1", layout["rollout"]["gpus"])
    prm = layout["prm"]
    if prm["replicas"] < 0:
        raise _invalid("prm.replicas", "0 (an external PRM) or more", prm["replicas"])
    if prm["replicas"] > 0 and prm["gpus"] < 1:
        raise _invalid("prm.gpus", "at least 1 when prm.replicas > 0", prm["gpus"])
    student = layout["student"]
    if student is not None and student["gpus"] < 1:
        raise _invalid("student.gpus", "at least 1 (or student: null for no student engine)", student["gpus"])
    if layout["cpusPerBundle"] <= 0:
        raise _invalid("cpusPerBundle", "greater than 0", fmt_number(layout["cpusPerBundle"]))
    if layout["colocate"]:
        for role in ("trainer", "rollout"):
            if layout[role]["gpus"] != 1:
                raise _invalid(f"{role}.gpus", "1 with colocate (the trainer and the rollout engine share one GPU)",
                               layout[role]["gpus"])


def _groups(layout: dict[str, Any]) -> list[dict[str, Any]]:
    cpu = layout["cpusPerBundle"]
    # The trainer's ranks talk over NCCL every step: STRICT_PACK keeps them on one node. Colocated,
    # its one bundle also holds the rollout engine (`COLOCATED_SHARE` of it each), so it has the
    # CPUs of two.
    per_bundle = {"GPU": 1, "CPU": _add(cpu, cpu) if layout["colocate"] else cpu}
    groups = [{
        "name": TRAINER_GROUP,
        "role": "trainer",
        "strategy": "STRICT_PACK",
        "bundles": [dict(per_bundle) for _ in range(layout["trainer"]["gpus"])],
    }]

    def single(name: str, role: str, gpus: int) -> dict[str, Any]:
        return {"name": name, "role": role, "strategy": "PACK", "bundles": [{"GPU": gpus, "CPU": cpu}]}

    if not layout["colocate"]:
        groups.append(single(ROLLOUT_GROUP, "rollout", layout["rollout"]["gpus"]))
    for i in range(layout["prm"]["replicas"]):
        groups.append(single(prm_group(i), "prm", layout["prm"]["gpus"]))
    if layout["student"] is not None:
        groups.append(single(STUDENT_GROUP, "student", layout["student"]["gpus"]))
    return groups


# Ray counts resources in fixed point to 1e-4; summing in binary floats instead, ten bundles of
# 0.7 CPU came to 7.000000000000001 and did not fit on 7 CPUs, which Ray would have placed.
_RESOURCE_DIGITS = 4


def _add(a: float, b: float) -> float:
    return round(a + b, _RESOURCE_DIGITS)


def _sum(groups: list[dict[str, Any]], resource: str) -> float:
    total = 0.0
    for group in groups:
        for bundle in group["bundles"]:
            total = _add(total, bundle[resource])
    return total


def _check_fit(groups: list[dict[str, Any]], available_gpus: float | None, available_cpus: float | None) -> None:
    """Walk the bundles in creation order and name the first one that would not fit."""
    used_gpus = 0.0
    used_cpus = 0.0
    total_gpus = _sum(groups, "GPU")
    total_cpus = _sum(groups, "CPU")
    for group in groups:
        for index, bundle in enumerate(group["bundles"]):
            if available_gpus is not None and _add(used_gpus, bundle["GPU"]) > available_gpus:
                raise ShimError(
                    "REEF_ERR_PLACEMENT",
                    f"cannot place {bundle_label(group['name'], index, {'GPU': bundle['GPU']})}: "
                    f"{fmt_number(used_gpus)} of {fmt_number(available_gpus)} logical GPUs already planned "
                    f"(the layout needs {fmt_number(total_gpus)})",
                )
            if available_cpus is not None and _add(used_cpus, bundle["CPU"]) > available_cpus:
                raise ShimError(
                    "REEF_ERR_PLACEMENT",
                    f"cannot place {bundle_label(group['name'], index, {'CPU': bundle['CPU']})}: "
                    f"{fmt_number(used_cpus)} of {fmt_number(available_cpus)} CPUs already planned "
                    f"(the layout needs {fmt_number(total_cpus)}; lower cpusPerBundle or declare more CPUs)",
                )
            used_gpus = _add(used_gpus, bundle["GPU"])
            used_cpus = _add(used_cpus, bundle["CPU"])


def plan_placement(
    layout: dict[str, Any],
    available_gpus: float | None = None,
    available_cpus: float | None = None,
) -> dict[str, Any]:
    """Plan the placement groups of `layout` (the bridge's Layout shape) and return a Plan.

    With `available_gpus` / `available_cpus` the plan is also checked against the cluster's totals,
    and the first bundle that cannot fit is named in a REEF_ERR_PLACEMENT error.
    """
    LAYOUT.check(layout, "layout")
    _check_values(layout)
    groups = _groups(layout)
    _check_fit(groups, available_gpus, available_cpus)
    plan = {"groups": groups, "totalGpus": int(_sum(groups, "GPU")), "totalCpus": _sum(groups, "CPU")}
    PLAN.check(plan, "plan")
    return plan

"""Table tests of the pure placement planner."""

from __future__ import annotations

from typing import Any

import pytest

from reef_shim.errors import ShimError
from reef_shim.placement import bundle_label, plan_placement


def layout(trainer: int = 4, rollout: int = 1, prm: int = 1, replicas: int = 1, student: int | None = 1,
           cpus: float = 1, colocate: bool = False) -> dict[str, Any]:
    return {"trainer": {"gpus": trainer}, "rollout": {"gpus": rollout}, "prm": {"gpus": prm, "replicas": replicas},
            "student": None if student is None else {"gpus": student}, "cpusPerBundle": cpus, "colocate": colocate}


def shape(plan: dict[str, Any]) -> list[tuple[str, str, str, list[tuple[float, float]]]]:
    return [(g["name"], g["role"], g["strategy"], [(b["GPU"], b["CPU"]) for b in g["bundles"]]) for g in plan["groups"]]


PLANS = [
    pytest.param(layout(), 7, 7, [
        ("reef-trainer", "trainer", "STRICT_PACK", [(1, 1)] * 4),
        ("reef-rollout", "rollout", "PACK", [(1, 1)]),
        ("reef-prm-0", "prm", "PACK", [(1, 1)]),
        ("reef-student", "student", "PACK", [(1, 1)]),
    ], 7, 7, id="reference-4-1-1-1-on-7"),
    pytest.param(layout(2, 1, 1, 0, None), 3, 3, [
        ("reef-trainer", "trainer", "STRICT_PACK", [(1, 1)] * 2),
        ("reef-rollout", "rollout", "PACK", [(1, 1)]),
    ], 3, 3, id="2-1-external-prm-no-student"),
    pytest.param(layout(2, 1, 2, 3, None), None, None, [
        ("reef-trainer", "trainer", "STRICT_PACK", [(1, 1)] * 2),
        ("reef-rollout", "rollout", "PACK", [(1, 1)]),
        ("reef-prm-0", "prm", "PACK", [(2, 1)]),
        ("reef-prm-1", "prm", "PACK", [(2, 1)]),
        ("reef-prm-2", "prm", "PACK", [(2, 1)]),
    ], 9, 6, id="three-prm-replicas-of-2-gpus"),
    pytest.param(layout(1, 2, 1, 0, 1, cpus=0.5), 4, 2, [
        ("reef-trainer", "trainer", "STRICT_PACK", [(1, 0.5)]),
        ("reef-rollout", "rollout", "PACK", [(2, 0.5)]),
        ("reef-student", "student", "PACK", [(1, 0.5)]),
    ], 4, 1.5, id="fractional-cpus-per-bundle"),
    pytest.param(layout(cpus=4), 7, 28, [
        ("reef-trainer", "trainer", "STRICT_PACK", [(1, 4)] * 4),
        ("reef-rollout", "rollout", "PACK", [(1, 4)]),
        ("reef-prm-0", "prm", "PACK", [(1, 4)]),
        ("reef-student", "student", "PACK", [(1, 4)]),
    ], 7, 28, id="cpus-per-bundle-4-exact-fit"),
    # Ten bundles of 0.7 CPU summed in floats came to 7.000000000000001 and were refused on 7 CPUs.
    pytest.param(layout(7, cpus=0.7), 10, 7, [
        ("reef-trainer", "trainer", "STRICT_PACK", [(1, 0.7)] * 7),
        ("reef-rollout", "rollout", "PACK", [(1, 0.7)]),
        ("reef-prm-0", "prm", "PACK", [(1, 0.7)]),
        ("reef-student", "student", "PACK", [(1, 0.7)]),
    ], 10, 7, id="fractional-cpus-exact-fit"),
    # The rollout engine lives in the trainer's bundle: one GPU, the CPUs of two.
    pytest.param(layout(1, 1, 1, 0, None, cpus=0.7, colocate=True), 1, 1.4, [
        ("reef-trainer", "trainer", "STRICT_PACK", [(1, 1.4)]),
    ], 1, 1.4, id="colocated-one-gpu"),
]


@pytest.mark.parametrize("lay,gpus,cpus,groups,total_gpus,total_cpus", PLANS)
def test_plans(lay, gpus, cpus, groups, total_gpus, total_cpus) -> None:
    plan = plan_placement(lay, gpus, cpus)
    assert shape(plan) == groups
    assert plan["totalGpus"] == total_gpus
    assert plan["totalCpus"] == total_cpus


TOO_SMALL = [
    pytest.param(layout(), 6, None,
                 "cannot place reef-student bundle 0 {GPU:1}: 6 of 6 logical GPUs already planned", id="student"),
    pytest.param(layout(), 3, None,
                 "cannot place reef-trainer bundle 3 {GPU:1}: 3 of 3 logical GPUs already planned", id="trainer"),
    pytest.param(layout(2, 1, 2, 2, None), 6, None,
                 "cannot place reef-prm-1 bundle 0 {GPU:2}: 5 of 6 logical GPUs already planned", id="2nd-prm"),
    pytest.param(layout(cpus=2), 7, 9,
                 "cannot place reef-rollout bundle 0 {CPU:2}: 8 of 9 CPUs already planned", id="cpus"),
    pytest.param(layout(), 0, None,
                 "cannot place reef-trainer bundle 0 {GPU:1}: 0 of 0 logical GPUs already planned", id="no-gpus"),
    pytest.param(layout(7, cpus=0.7), 10, 6.9,
                 "cannot place reef-student bundle 0 {CPU:0.7}: 6.3 of 6.9 CPUs already planned (the layout needs 7;",
                 id="fractional-cpus-amounts-read-as-written"),
]


@pytest.mark.parametrize("lay,gpus,cpus,message", TOO_SMALL)
def test_too_small_names_the_bundle(lay, gpus, cpus, message) -> None:
    with pytest.raises(ShimError) as err:
        plan_placement(lay, gpus, cpus)
    assert err.value.code == "REEF_ERR_PLACEMENT"
    assert err.value.message.startswith(message)


INVALID = [
    pytest.param(layout(trainer=0), "layout.trainer.gpus must be at least 1, got 0", id="trainer-0"),
    pytest.param(layout(rollout=-1), "layout.rollout.gpus must be at least 1, got -1", id="rollout-negative"),
    pytest.param(layout(replicas=-1), "layout.prm.replicas must be 0 (an external PRM) or more, got -1", id="replicas"),
    pytest.param(layout(prm=0, replicas=2), "layout.prm.gpus must be at least 1 when prm.replicas > 0, got 0",
                 id="prm-gpus-0"),
    pytest.param(layout(student=0), "layout.student.gpus must be at least 1", id="student-0"),
    pytest.param(layout(cpus=0), "layout.cpusPerBundle must be greater than 0, got 0", id="cpus-0"),
    pytest.param(layout(cpus=-0.5), "layout.cpusPerBundle must be greater than 0, got -0.5", id="cpus-negative"),
    pytest.param(layout(trainer=2, colocate=True), "layout.trainer.gpus must be 1 with colocate", id="colocate-2-ranks"),
    pytest.param(layout(trainer=1, rollout=2, colocate=True), "layout.rollout.gpus must be 1 with colocate",
                 id="colocate-rollout-2"),
]


@pytest.mark.parametrize("lay,message", INVALID)
def test_invalid_values(lay, message) -> None:
    with pytest.raises(ShimError) as err:
        plan_placement(lay)
    assert err.value.code == "REEF_ERR_INVALID_ARGUMENT"
    assert err.value.message.startswith(message)


def test_external_prm_ignores_prm_gpus() -> None:
    plan = plan_placement(layout(prm=0, replicas=0))
    assert [g["name"] for g in plan["groups"]] == ["reef-trainer", "reef-rollout", "reef-student"]


def test_malformed_layout_is_a_bad_message() -> None:
    bad = layout()
    bad["trainer"] = {"gpus": 1.5}
    with pytest.raises(ShimError) as err:
        plan_placement(bad)
    assert err.value.code == "REEF_ERR_BAD_MESSAGE"
    assert "layout.trainer.gpus" in err.value.message


def test_bundle_label_formats_amounts() -> None:
    assert bundle_label("reef-rollout", 0, {"GPU": 1.0, "CPU": 0.5}) == "reef-rollout bundle 0 {GPU:1, CPU:0.5}"

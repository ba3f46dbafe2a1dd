"""The one stage table (schemas/layout.py STAGES): the flow's task names, the report's stages and
the run directory's folders all read it. (That a run executes the stages in the table's order is
checked on a real run: tests/test_flow.py, the clean run.)"""

from __future__ import annotations

from schemas.layout import STAGES, RunLayout, stage_info, stage_of_run


def test_the_table_is_in_order_with_unique_ids_and_names():
    assert [s.order for s in STAGES] == list(range(len(STAGES)))
    assert len({s.id for s in STAGES}) == len({s.name for s in STAGES}) == len(STAGES)


def test_the_report_shows_table_stages_in_table_order():
    from report.model import STAGES as REPORT_STAGES
    from report.model import GateStage

    orders = [stage_info(s.key).order for s in REPORT_STAGES]
    assert orders == sorted(orders)
    layout = RunLayout("/runs/x")
    for s in REPORT_STAGES:
        assert s.title == stage_info(s.key).name
        if isinstance(s, GateStage):  # a gate's table is in its stage's folder
            assert s.gate_dir(layout) == layout.root / stage_info(s.key).folder


def test_the_layout_puts_each_stage_in_its_table_folder():
    layout = RunLayout("/runs/x")
    folders = {
        "spec": layout.spec_dir, "preflight": layout.preflight_dir, "unit_checks": layout.unit_checks_dir,
        "pilot": layout.pilot_dir("pilot"), "audit_pilot": layout.audit_dir("pilot"),
        "activation_gate": layout.gate_dir("pilot"), "calibration_pilot": layout.pilot_dir("calibration"),
        "audit_calibration": layout.audit_dir("calibration"), "calibration": layout.gate_dir("calibration"),
        "calibrated_spec": layout.revised_spec_json.parent, "feasibility": layout.feasibility_dir,
        "train": layout.train_arm_dir("a").parent, "audit_train": layout.audit_dir("train"),
        "eval": layout.eval_arm_dir("a").parent, "decision": layout.decision_dir, "report": layout.report_dir,
    }
    assert set(folders) == {s.id for s in STAGES}
    for id, folder in folders.items():
        assert folder == layout.root / stage_info(id).folder, id


def test_the_flow_names_its_task_runs_from_the_table():
    from tasks.arms import eval_items, pilot_rollouts, trained_arm
    from tasks.gates import (activation_gate, audit_gate, family_decision_record, feasibility, offline_unit_checks,
                             paired_decision_record)
    from tasks.preflight import correctness_preflight
    from tasks.run_report import run_report
    from tasks.spec import calibrated_plan, validated_plan

    fixed = {validated_plan: "spec", correctness_preflight: "preflight", offline_unit_checks: "unit_checks",
             feasibility: "feasibility", calibrated_plan: "calibrated_spec", paired_decision_record: "decision",
             run_report: "report"}
    for task, id in fixed.items():
        assert task.task_run_name == stage_info(id).name == stage_of_run(task.task_run_name).name
    assert stage_of_run(family_decision_record.task_run_name).id == "decision"
    # per stage parameter or per unit: the run names the table's stage
    assert pilot_rollouts.name == stage_info("pilot").name and activation_gate.name == stage_info("activation_gate").name
    assert audit_gate.name == "audit"
    assert trained_arm.task_run_name == "train {arm.unit}" and eval_items.task_run_name == "eval {arm.unit}"
    assert stage_of_run("train grpo_gs8-s1").id == "train" and stage_of_run("eval gs1_kernel").id == "eval"
    assert stage_of_run("calibration gate").id == "calibration" and stage_of_run("something else") is None

"""A decision's record and its files: the two-arm decision (`write_paired_decision`) and the
family of every compared arm against the baseline under the plan's rule, Holm over them
(`family_record`, `write_family_decision`). The decision stage and `gs1 decide --units` are
their callers; every input is read and decided before the first file is written.
"""

from __future__ import annotations

from design.plan import DecisionPlan
from rl.stats import family_decision, paired_decision
from rules.registry import rule_for
from schemas.artifacts import COMPARISONS, DECISION, write_artifact
from schemas.io import write_json_atomic, write_text_atomic
from schemas.layout import DecisionFiles


def write_paired_decision(treatment_eval: str, baseline_eval: str, decision: DecisionPlan, names: dict,
                          out: DecisionFiles) -> tuple[dict, str]:
    """The two-arm decision's files `out` (decision.json, decision.parquet, decision.md): the plan's
    rule (+ McNemar, bootstrap) on the two arms' per-item correctness. Returns the record and its
    markdown."""
    record = paired_decision(treatment_eval, baseline_eval, alpha=decision.alpha, margin=decision.margin,
                             bounds=tuple(decision.bounds), rule=decision.rule, design=decision.power)
    record = {**record, "criterion": decision.criterion, "treatment": names["treatment"], "baseline": names["baseline"]}
    write_json_atomic(out.json, record)
    write_artifact("decision", [{c: record.get(c) for c in DECISION.names}], out.parquet)
    markdown = decision_markdown(record)
    write_text_atomic(out.markdown, markdown)
    return record, markdown


def decision_markdown(record: dict) -> str:
    rule = rule_for(record["method"])
    return (
        f"# Decision: **{record['verdict']}**\n\n"
        f"{record['treatment']} minus {record['baseline']}, paired over {record['n']} eval items; "
        f"rule {rule.method}: {rule.summary}.\n\n"
        f"| quantity | value |\n|---|---|\n"
        f"| mean difference | {record['mean_diff']:+.4f} |\n"
        f"| lower bound ({rule.bounds_name}, alpha={record['alpha']}) | {record['lower']:+.4f} |\n"
        f"| upper bound | {record['upper']:+.4f} |\n"
        f"| noninferiority margin | {record['margin']:+.4f} |\n"
    )


def write_family_decision(eval_files: list[str], units: list[tuple[str, int]], decision: DecisionPlan, names: dict,
                          out: DecisionFiles) -> tuple[dict, str]:
    """The family decision's files `out` (decision.json, decision.parquet,
    comparisons.parquet, decision.md) under the plan's rule: the decision stage's and `gs1 decide
    --units`' one writer (its secondary readings under another rule too). Every input is read and
    decided before the first file is written. Returns the record and its markdown."""
    record = family_record(eval_files, units, decision, names)
    return record, write_decision_files(record, out)


def write_decision_files(record: dict, out: DecisionFiles) -> str:
    """A family decision record's files in `out` (decision.json, decision.parquet,
    comparisons.parquet, decision.md); returns its markdown."""
    markdown = family_markdown(record)
    write_json_atomic(out.json, record)
    write_artifact("decision", [{c: record.get(c) for c in DECISION.names}], out.parquet)
    write_artifact("comparisons", [{c: p.get(c) for c in COMPARISONS.names}
                                   for p in record["comparisons"]], out.comparisons)
    write_text_atomic(out.markdown, markdown)
    return markdown


def family_record(eval_files: list[str], units: list[tuple[str, int]], decision: DecisionPlan, names: dict) -> dict:
    """Every compared arm against the baseline under the plan's rule, Holm over them: the record
    decision.json holds (the treatment's pair at the top level, the family and every pair)."""
    by_arm: dict[str, dict[int, str]] = {}
    for path, (arm, seed) in zip(eval_files, units, strict=True):
        by_arm.setdefault(arm, {})[int(seed)] = path
    baseline = names["baseline"]
    compared = {arm: by_arm[arm] for arm in decision.compared or (names["treatment"],)}
    family = family_decision(compared, by_arm[baseline], alpha=decision.alpha, margin=decision.margin,
                             bounds=tuple(decision.bounds), rule=decision.rule, design=decision.power)
    for pair in family["comparisons"]:
        pair.update(criterion=decision.criterion, treatment=pair["arm"], baseline=baseline)
    primary = next(p for p in family["comparisons"] if p["arm"] == names["treatment"]) if names["treatment"] in compared \
        else family["comparisons"][0]
    return {**{k: v for k, v in primary.items() if k != "arm"}, **family}


def family_markdown(record: dict) -> str:
    family = record["family"]
    rule = rule_for(record["method"])
    rows = "\n".join(
        f"| {p['arm']} | {p['treatment_mean']:.4f} | {p['mean_diff']:+.4f} | [{p['lower']:+.4f}, {p['upper']:+.4f}] | "
        f"{p['holm_p_noninferior']:.3g} | {p['holm_p_inferior']:.3g} | **{p['verdict']}** |"
        for p in record["comparisons"]
    )
    return (
        f"# Decision: {family['m']} arm(s) against **{record['baseline']}** "
        f"(accuracy {record['baseline_mean']:.4f}), {len(record['seeds'])} seed(s)\n\n"
        f"Paired over {record['n']} eval items within each seed (seeds {', '.join(map(str, record['seeds']))}); "
        f"noninferiority margin {record['margin']:+.4f}. Rule {rule.method}: {rule.summary}; it covers {rule.covers}.\n\n"
        f"{family['statement']}\n\n"
        f"| arm | accuracy | mean difference | {rule.bounds_name} (α={record['alpha']:g} each side) | "
        f"Holm p (noninferior) | Holm p (inferior) | verdict |\n|---|---|---|---|---|---|---|\n{rows}\n"
    )

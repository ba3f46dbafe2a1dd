"""The decision rules: one Rule per spec `decision_rule.method`, and the union of their settings.

A rule is one module of this package with a `RULE`; adding a rule is adding its module to
`RULE_MODULES`. Everything that decides, words a decision or plans power asks `rule_for(method)`.
"""

from __future__ import annotations

from typing import Annotated, Union

from pydantic import Field

from rules import hierarchical_bootstrap, paired_hoeffding, paired_score, paired_seed_t
from rules.base import Rule

RULE_MODULES = (paired_hoeffding, paired_seed_t, hierarchical_bootstrap, paired_score)
RULES: dict[str, Rule] = {module.RULE.method: module.RULE for module in RULE_MODULES}
METHODS = tuple(RULES)
DEFAULT_METHOD = RULE_MODULES[0].RULE.method  # the user's pre-registered rule: `gs1 decide` without --rule

# DecisionPlan.rule: the settings of the plan's rule, discriminated by its `method`.
RuleSettingsUnion = Annotated[Union[tuple(r.settings_type for r in RULES.values())], Field(discriminator="method")]  # noqa: UP007


def rule_for(method: str) -> Rule:
    """The Rule of a spec `decision_rule.method`; ValueError naming the known ones otherwise."""
    try:
        return RULES[method]
    except KeyError:
        raise ValueError(f"unsupported decision method {method!r} (supported: {', '.join(METHODS)})") from None


def own_spec_keys() -> frozenset[str]:
    """Every rule's own decision_rule keys."""
    return frozenset(k for r in RULES.values() for k in r.own_spec_keys)

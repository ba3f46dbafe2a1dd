"""Decision rules: one module per `decision_rule.method` (float64 numpy + scipy, small pure
functions), the registry the rest of gs1 asks (`rule_for`), and the power model (`power`).
Each rule reads paired per-item outcomes grouped by seed (`SeededPairs`) and answers a `Reading`.
"""

from rules.base import Reading, Rule, RuleSettings, SeededPairs
from rules.power import PowerDesign, PowerReading, power_reading
from rules.registry import DEFAULT_METHOD, METHODS, RULES, RuleSettingsUnion, rule_for

__all__ = ["DEFAULT_METHOD", "METHODS", "RULES", "PowerDesign", "PowerReading", "Reading", "Rule",
           "RuleSettings", "RuleSettingsUnion", "SeededPairs", "power_reading", "rule_for"]

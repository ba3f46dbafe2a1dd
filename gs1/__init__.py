"""gs1: pre-registered, gated RL experiments (GS1 kernel baseline vs GRPO) on Prefect + Tinker."""

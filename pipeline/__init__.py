"""How a stage runs on Prefect, shared by the tasks: its cache policy and output manifests
(`cache`), its start and end hooks (`running`), its published artifacts (`artifacts`), a gate's
stop (`judging`) and the process's backend session (`services`). No stage lives here: the stages
are `tasks/`."""

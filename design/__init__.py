"""The pre-registered experiment: the spec a user hands in (`design.spec`, validated by the arm
kinds and the decision rules), its arms as they run (`design.arm`), the run plan every stage is
handed (`design.plan`) and the spec's recorded revisions (`design.revision`)."""

"""Discrete-event cluster simulator for agentic RL post-training (pure Python + numpy).

It runs the project's real placement policies (``scheduling.policy``) and the
real planner core (``scheduling.planner``) against a workload trace, on a
simulated cluster whose instances follow the planner's roofline cost model. See
``docs/simulator.md``.
"""

"""The scheduling algorithms, pure and shared: C-MLFQ and its peer policies
(``scheduling.policy``) and the cross-stage planner (``scheduling.planner``).

The scheduler and coordinator services and the simulator run this same code.
"""

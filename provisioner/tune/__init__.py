"""Closed-loop tuning: measure this box's best values of the plan's knobs on the team's workloads.

pairs: the rule by which a measured value is kept over the plan's rule, on a noisy machine.
"""

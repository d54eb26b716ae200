"""Capacity planning: how many workers (GPUs) for this traffic at this p99.

``calibrate`` measures models and the host at idle (:mod:`.calibrate`); the planner
(:mod:`.plan`) searches fleet sizes with the fleet simulator. JAX-free.
"""

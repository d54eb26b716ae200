"""Capacity planning: how many workers (GPUs) for this traffic at this p99.

``calibrate`` measures models and the host at idle (:mod:`.calibrate`); the planner
(:mod:`.plan`) searches fleet sizes with the fleet simulator. JAX-free. The modules:

``calibrate``      the models' and the host's costs, measured at idle
``plan``           the search over fleet sizes, and the plan it answers
``fleet``          one candidate fleet, simulated: N devices for the traffic
``costs``          the costs file: what the planner knows about the models and the machine
``device``         the device file: the hardware a plan buys
``traffic``        the traffic file, or a window recorded from a live /metrics
``metrics_input``  costs read from a live worker's or gateway's /metrics
``cpu``            CPU time of a process and its threads, and how busy the machine is
``checks``         typed values out of the planner's plain YAML, every problem gathered
``command``        the ``plan`` and ``calibrate`` subcommands' work
"""

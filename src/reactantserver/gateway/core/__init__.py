"""The gateway's sans-IO core: records and decisions, handed ``now`` and events.

Nothing here imports asyncio, trio, socket or grpclib, directly or through what it imports
(the folder rule, ``tests/project/test_import_graph.py``); the gateway's I/O in the folder
above and the fleet simulator (``reactantserver.fleet``) drive the same objects.

``table``      the immutable route table built from the workers' probe answers
               (replicas per model, batch axis, learned cost per item, fleet totals)
``routing``    the Router seam: round_robin, least_outstanding and lpt_packing fill routing;
               choose / failover / release and in-flight accounting
``inflight``   what is in flight, counted once, and the admission, failover and
               stream-slot rules that read it
``callstate``  where a forwarded call stands: its transition table (events in, a state out)
``packing``    the LPT packer: a pure function from demand, weight bytes and budgets to a
               placement, with hysteresis and the oversubscription warning
``estimates``  rate and cost EWMAs on the fleet-compute clock; the repack cadence
``control``    the lpt_packing controller: repack, control-RPC semantics, status records
``policy``     GatewayControlService values: checked against gateway.yml's rules
``wire``       the peek at a ModelInfer's bytes, read without a protobuf runtime
``stats``      the gateway's own counters and the frozen records metrics read
``merge``      one answer from many workers' answers (protobuf messages: data only)
``energy``     the workers' energy summed into Prometheus metric families
"""

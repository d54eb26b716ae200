"""The gRPC-over-HTTP/2 rules the transport's edges apply, sans-IO.

Nothing here imports asyncio, trio, socket or grpclib, directly or through what it imports
(``tests/project/test_import_graph.py``):

``framing``      the rules of a gRPC request's headers and message framing, as pure functions
``limits``       ``WireLimits`` (what a peer may do), ``Fault`` (kinds of client mistakes),
                 ``WireCounters`` / ``WireStatistics`` (what the wire counted, for /metrics)
``auth``         who a call is, and whether it may do what it asks: restricted API groups
``compression``  gzip / deflate request messages, inflated a step at a time within bounds
``faultlog``     rate-limited logging of client mistakes
``reclaim``      when to give memory back after a hostile burst
"""

"""HTTP/2, sans-IO: one connection for both roles, the ground floor of the package.

Bytes in, events out; what to send, out as bytes. Nothing here imports asyncio, trio,
socket or grpclib, nor any module of the package outside this folder (its limits, events
and errors are its own, as h11's are; ``tests/project/test_import_graph.py``):

``core``    one HTTP/2 connection for both roles: the stream table, the stream and
            connection states as transition tables, flow control both ways, SETTINGS,
            the abuse budget, one handler per frame type
``server``  its server role: what a gRPC server sends
``client``  its client role: unary gRPC calls (the gateway's worker connections and the
            Python client)
``parse``   the one frame reader, for either role: frames read straight from their bytes
``events``  the events, exceptions and codes both roles report
``wire``    the wire numbers and frame headers
``hpack``   HPACK as both roles use it (hpack's public decoder and our encoders)
``abuse``   one abuse budget per connection, given the time: what a peer may make us do
            for nothing
``limits``  the bounds a connection holds its peer to, and the rules a peer can break
"""

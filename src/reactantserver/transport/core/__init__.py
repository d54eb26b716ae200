"""The gRPC-over-HTTP/2 rules, sans-IO (see each module)."""

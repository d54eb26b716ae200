"""HTTP/2, sans-IO: both roles of one connection (see core)."""

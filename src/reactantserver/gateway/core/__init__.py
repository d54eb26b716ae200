"""The gateway's pure core: decisions handed `now` and events (see each module)."""

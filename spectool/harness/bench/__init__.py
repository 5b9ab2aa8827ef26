"""spectool bench: throughput of no-spec, EAGLE-3 and the patched fallback, per concurrency."""

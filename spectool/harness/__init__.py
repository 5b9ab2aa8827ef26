"""The GPU harness: golden tests (`verify`) and throughput sweeps (`bench`) of a patched SGLang.

Nothing in the core (recipe model, plan, transaction, lockfile, source, fetch, api) imports
this package; the CLI loads it only for the `verify` and `bench` commands.
"""

"""Engine arguments across SGLang releases: the same settings under each release's names.

0.5.17 renamed ``cuda_graph_max_bs`` to ``cuda_graph_max_bs_decode`` and replaced
``disable_piecewise_cuda_graph`` by ``cuda_graph_backend_prefill``. The harnesses write the
0.5.12 names; this maps them onto whatever the running SGLang's ServerArgs has, by looking
at its fields rather than at version numbers.
"""

from __future__ import annotations

RENAMES = {"cuda_graph_max_bs": "cuda_graph_max_bs_decode"}
REPLACEMENTS = {"disable_piecewise_cuda_graph": ("cuda_graph_backend_prefill", lambda v: "disabled" if v else None)}


def adapt(kwargs: dict, fields: set[str]) -> dict:
    out = {}
    for key, value in kwargs.items():
        if key in fields:
            out[key] = value
        elif key in RENAMES and RENAMES[key] in fields:
            out[RENAMES[key]] = value
        elif key in REPLACEMENTS and REPLACEMENTS[key][0] in fields:
            new_key, convert = REPLACEMENTS[key]
            if convert(value) is not None:
                out[new_key] = convert(value)
        else:
            raise KeyError(f"engine argument {key!r} does not exist in this SGLang release")
    return out


def server_arg_fields() -> set[str]:
    import dataclasses

    from sglang.srt.server_args import ServerArgs

    return {f.name for f in dataclasses.fields(ServerArgs)}


def rendezvous_port(port: int) -> int:
    """The torch.distributed rendezvous port (SGLang's nccl_port) of the engine at `port`, for
    both harnesses: a fixed one inside the engine's own block of ports. Left unset, SGLang
    picks a free port and binds it later; with ten TP=2 engines starting at once on the H200
    another process took it in between (EADDRINUSE on 33225,
    results/verify-0.5.12-tp2/session10-fdfb10d/)."""
    return port + 29

"""Engine arguments and calls across SGLang releases: the same settings under each release's
names, and the profiler started as each release takes it.

0.5.17 renamed ``cuda_graph_max_bs`` to ``cuda_graph_max_bs_decode`` and replaced
``disable_piecewise_cuda_graph`` by ``cuda_graph_backend_prefill``. The harnesses write the
0.5.12 names; this maps them onto whatever the running SGLang's ServerArgs has, by looking
at its fields rather than at version numbers.
"""

from __future__ import annotations

import ast
from pathlib import Path

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


def start_profile(tokenizer_manager, **settings):
    """The tokenizer manager's start_profile with `settings` (output_dir, num_steps, ...): as
    keyword arguments up to 0.5.14, as one ProfileReq from 0.5.15 (its only parameter, `req`),
    told apart by the method's own parameters. Returns the coroutine to await."""
    import inspect

    if profile_takes_request(inspect.signature(tokenizer_manager.start_profile).parameters):
        from sglang.srt.managers.io_struct import ProfileReq

        return tokenizer_manager.start_profile(ProfileReq(**settings))
    return tokenizer_manager.start_profile(**settings)


def profile_takes_request(parameters) -> bool:
    """Whether a start_profile with these parameter names takes one ProfileReq."""
    return "req" in parameters and "output_dir" not in parameters


def server_arg_fields() -> set[str]:
    import dataclasses

    from sglang.srt.server_args import ServerArgs

    return {f.name for f in dataclasses.fields(ServerArgs)}


def server_args_path(sglang_dir: str | None = None) -> Path:
    """The server_args.py of the tree under --sglang-dir, else of the installed SGLang."""
    import importlib.util

    from ..errors import BadInputError

    if sglang_dir:
        from ..source import locate

        return locate(sglang_dir).root / "sglang" / "srt" / "server_args.py"
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise BadInputError("no SGLang is installed to read ServerArgs from; pass --sglang-dir.")
    return Path(next(iter(spec.submodule_search_locations))) / "srt" / "server_args.py"


def server_args_source(sglang_dir: str | None = None) -> str:
    """The text of that server_args.py (with what the recipes inserted), or a clear error."""
    from ..errors import BadInputError

    path = server_args_path(sglang_dir)
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise BadInputError(f"cannot read SGLang's ServerArgs from {path}: {exc}.") from None


def server_arg_annotations(sglang_dir: str | None = None) -> dict[str, str]:
    """ServerArgs field name -> its type as written (``Optional[int]``), read from the
    server_args.py of the tree under --sglang-dir (else of the installed SGLang) without
    importing it. Annotated fields (0.5.17+: ``A[int, "help", ...]``) give their type."""
    from ..errors import BadInputError

    path = server_args_path(sglang_dir)
    try:
        tree = ast.parse(server_args_source(sglang_dir))
    except SyntaxError as exc:
        raise BadInputError(f"cannot read SGLang's ServerArgs from {path}: {exc}.") from None
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs"), None)
    if cls is None:
        raise BadInputError(f"{path} defines no class ServerArgs.")
    out = {}
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            ann = node.annotation
            if isinstance(ann, ast.Subscript) and ast.unparse(ann.value) in ("A", "Annotated"):
                ann = ann.slice.elts[0] if isinstance(ann.slice, ast.Tuple) else ann.slice
            out[node.target.id] = ast.unparse(ann)
    return out


def server_arg_value(name: str, text: str, annotation: str):
    """`text` (as on a command line) as a value of the ServerArgs field `name` of type
    `annotation`: whole numbers, decimals and true/false for int, float and bool fields,
    comma-separated whole numbers for List[int] ones, 'off' or 'None' for None where the
    field is Optional, the text itself otherwise. A ValueError says what the field takes."""
    optional = annotation.startswith("Optional[") and annotation.endswith("]")
    kind = annotation[len("Optional[") : -1] if optional else annotation
    if optional and text in ("off", "None"):
        return None
    none = " or off" if optional else ""
    if kind == "bool":
        if text.lower() in ("true", "1", "false", "0"):
            return text.lower() in ("true", "1")
        raise ValueError(f"{name} ({annotation}) takes true or false{none}, not {text!r}")
    if kind in ("List[int]", "list[int]"):
        try:
            return [int(part) for part in text.split(",")]
        except ValueError:
            raise ValueError(f"{name} ({annotation}) takes comma-separated whole numbers{none}, not {text!r}") from None
    for typ, what in ((int, "a whole number"), (float, "a number")):
        if kind == typ.__name__:
            try:
                return typ(text)
            except ValueError:
                raise ValueError(f"{name} ({annotation}) takes {what}{none}, not {text!r}") from None
    return text


def rendezvous_port(port: int) -> int:
    """The torch.distributed rendezvous port (SGLang's nccl_port) of the engine at `port`, for
    both harnesses: a fixed one inside the engine's own block of ports. Left unset, SGLang
    picks a free port and binds it later; with ten TP=2 engines starting at once on the H200
    another process took it in between (EADDRINUSE)."""
    return port + 29

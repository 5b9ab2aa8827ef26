"""Engine arguments are mapped onto each release's ServerArgs fields (read from the source)."""

import ast

import pytest

from spectool.engine_compat import adapt

pytestmark = pytest.mark.network


def _fields(tree):
    src = (tree / "sglang/srt/server_args.py").read_text()
    cls = next(n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.ClassDef) and n.name == "ServerArgs")
    return {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}


KW = {"cuda_graph_max_bs": 32, "disable_piecewise_cuda_graph": True, "attention_backend": "triton",
      "speculative_disable_batch_size_threshold": 4}


def test_0512_names_pass_through(sglang_release):
    from spectool import api

    tree = sglang_release("0.5.12")
    api.apply(tree)
    assert adapt(KW, _fields(tree)) == KW


def test_0517_names_are_mapped(sglang_release):
    from spectool import api

    tree = sglang_release("0.5.17")
    api.apply(tree)
    out = adapt(KW, _fields(tree))
    assert out == {"cuda_graph_max_bs_decode": 32, "cuda_graph_backend_prefill": "disabled",
                   "attention_backend": "triton", "speculative_disable_batch_size_threshold": 4}


def test_unknown_argument_is_an_error(sglang_release):
    with pytest.raises(KeyError, match="does not exist"):
        adapt({"speculative_disable_batch_size_threshold": 4}, _fields(sglang_release("0.5.17")))

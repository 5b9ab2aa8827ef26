"""SM120 recipe: call the patched DeepGEMM gate with a simulated compute capability.

No RTX PRO 6000 is available: the decision is checked by running the real patched function
of SGLang 0.5.12 with its collaborators simulated (device SM, CUDA flag, deep_gemm import,
the JIT env switch), for SM120 and for SM90 (which must be unchanged).
"""

from __future__ import annotations

import sys
import types

import pytest

from spectool import api
from spectool.testing import load_function

pytestmark = pytest.mark.network

FILE = "sglang/srt/layers/deep_gemm_wrapper/configurer.py"


class _Env:
    class SGLANG_ENABLE_JIT_DEEPGEMM:  # noqa: N801 - mirrors sglang.srt.environ.envs
        @staticmethod
        def get():
            return True


def _decide(path, sm):
    fn = load_function(
        path,
        "_compute_enable_deep_gemm",
        {"get_device_sm": lambda: sm, "_is_cuda": True, "_is_musa": False, "envs": _Env},
    )
    sys.modules.setdefault("deep_gemm", types.ModuleType("deep_gemm"))
    return fn()


@pytest.fixture(scope="module")
def patched_and_pristine(sglang_release, cached_release):
    pristine = cached_release("0.5.12")
    patched = sglang_release("0.5.12")
    out = api.apply(patched, select=["sm120"])
    assert out.ok
    return patched / FILE, pristine / FILE


def test_sm120_turns_deepgemm_off(patched_and_pristine):
    patched, pristine = patched_and_pristine
    assert _decide(pristine, 120) is True, "0.5.12 as released enables DeepGEMM on SM120 (the bug)"
    assert _decide(patched, 120) is False


@pytest.mark.parametrize("sm", [90, 100])
def test_other_archs_unchanged(patched_and_pristine, sm):
    patched, pristine = patched_and_pristine
    assert _decide(patched, sm) == _decide(pristine, sm) is True


def test_pre_hopper_unchanged(patched_and_pristine):
    patched, _ = patched_and_pristine
    assert _decide(patched, 80) is False

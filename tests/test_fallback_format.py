"""The fallback's decode step on the real patched files, with a simulated target and draft:
the result must be exactly what that release's scheduler reads (0.5.8: stride from the
worker, padded; 0.5.12: stride 1 from the result), and the verify graph is never left
installed."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from spectool import api
from spectool.testing import load_function

pytestmark = pytest.mark.network


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("version", ["0.5.8", "0.5.12"])
def test_fallback_result_format(version, sglang_release, monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, stream: None, raising=False)
    tree = sglang_release(version)
    assert api.apply(tree).ok
    path = tree / "sglang/srt/speculative/eagle_worker_v2.py"
    seed = version == "0.5.8"
    bonus = "verified_id" if seed else "bonus_tokens"

    class Result(SimpleNamespace):
        pass

    class DraftInput(SimpleNamespace):
        pass

    events = SimpleNamespace(Event=lambda: SimpleNamespace(record=lambda: None), current_stream=lambda: None)
    fake_torch = SimpleNamespace(**{k: getattr(torch, k) for k in ("int32", "int64", "ones", "softmax")},
                                 get_device_module=lambda device: events)
    ns = {"torch": fake_torch, "GenerationBatchResult": Result, "EagleDraftInput": DraftInput,
          "ForwardMode": SimpleNamespace(DECODE="DECODE"), "CaptureHiddenMode": SimpleNamespace(NULL="NULL", FULL="FULL"),
          "speculative_moe_backend_context": _null, "speculative_moe_a2a_backend_context": _null}
    decode = load_function(path, "EAGLEWorkerV2._spec_fallback_decode", ns)

    bs, ndt = 3, 4
    req_to_token = torch.arange(100).reshape(5, 20).to(torch.int32)
    seen = {}

    def target_forward(batch):
        seen.update(input_ids=batch.input_ids.clone(), seq_lens=batch.seq_lens.clone(),
                    out_cache_loc=batch.out_cache_loc.clone(), mode=batch.forward_mode,
                    installed=(mr.attn_backend, mr.graph_runner), capture=batch.capture_hidden_mode)
        return SimpleNamespace(logits_output=SimpleNamespace(hidden_states=torch.zeros(bs, 6)),
                               next_token_ids=torch.tensor([7, 8, 9]), can_run_cuda_graph=True)

    mr = SimpleNamespace(attn_backend="spec-backend", graph_runner="verify-graph")
    worker = SimpleNamespace(
        device="cpu", speculative_num_draft_tokens=ndt, req_to_token_pool=SimpleNamespace(req_to_token=req_to_token),
        speculative_algorithm=SimpleNamespace(is_standalone=lambda: False),
        _target_worker=SimpleNamespace(model_runner=mr, forward_batch_generation=target_forward),
        _fallback_attn_backend="decode-backend", _fallback_graph_runner="decode-graph",
        draft_worker=SimpleNamespace(draft_tp_context=lambda g: _null(), draft_runner=SimpleNamespace(tp_group=None)),
        _spec_fallback_draft_extend=lambda *a: seen.setdefault("draft_extend", a),
    )
    batch = SimpleNamespace(seq_lens=torch.tensor([3, 5, 10]), seq_lens_cpu=torch.tensor([3, 5, 10]), seq_lens_sum=18,
                            req_pool_indices=torch.tensor([0, 2, 4]),
                            spec_info=DraftInput(**{bonus: torch.tensor([1, 2, 3], dtype=torch.int32)}))
    res = decode(worker, batch)

    assert seen["input_ids"].tolist() == [1, 2, 3] and seen["seq_lens"].tolist() == [4, 6, 11]
    assert seen["out_cache_loc"].tolist() == [3, 45, 90]  # req_to_token[req, seq_len]: the bonus slot
    assert seen["mode"] == "DECODE" and seen["capture"] == "FULL"  # EAGLE-3 needs the aux hidden states
    assert seen["installed"] == ("decode-backend", "decode-graph"), "the target ran on its own decode graph"
    assert (mr.attn_backend, mr.graph_runner) == ("spec-backend", "verify-graph"), "verify graph restored"
    assert res.accept_lens.tolist() == [1, 1, 1] and res.accept_lens.dtype == torch.int32
    assert getattr(res.next_draft_input, bonus).tolist() == [7, 8, 9]
    assert res.next_draft_input.new_seq_lens.tolist() == [4, 6, 11]
    assert batch.seq_lens.tolist() == [3, 5, 10], "the draft extend sees the pre-step lengths"
    assert seen["draft_extend"][1].tolist() == [7, 8, 9], "draft KV sync over the produced tokens"
    if seed:  # the 0.5.8 consumer: stride = draft_worker.speculative_num_draft_tokens
        stride = ndt
        assert not hasattr(res, "speculative_num_draft_tokens")
    else:  # the 0.5.12 consumer: stride = result.speculative_num_draft_tokens
        stride = res.speculative_num_draft_tokens
        assert stride == 1
    ids, acc = res.next_token_ids.tolist(), res.accept_lens.tolist()
    assert len(ids) == bs * stride
    assert [ids[i * stride: i * stride + acc[i]] for i in range(bs)] == [[7], [8], [9]]

"""The release classes tests build their objects from (tests/sglang_source.py): a class of
the fetched release on its own bases, and an instance of it holding only what the release's
type can hold."""

from __future__ import annotations

import pytest

from .sglang_source import release_instance, release_type

pytestmark = pytest.mark.network


def test_a_release_type_stands_on_the_releases_own_bases(cached_release):
    tree = cached_release("0.5.12")
    worker = release_type(tree, "EAGLEWorkerV2")
    assert [k.__name__ for k in worker.__mro__][:2] == ["EAGLEWorkerV2", "BaseSpecWorker"]
    assert worker.forward_batch_generation.__code__.co_filename.endswith("eagle_worker_v2.py:EAGLEWorkerV2")
    algorithm = release_type(tree, "SpeculativeAlgorithm")
    assert algorithm.EAGLE3.is_eagle3() and not algorithm.EAGLE3.is_standalone()


def test_an_instance_holds_what_the_release_assigns_and_refuses_the_rest(cached_release):
    tree = cached_release("0.5.12")
    worker = release_instance(release_type(tree, "EAGLEWorkerV2"), device="cpu", topk=1)
    assert (worker.device, worker.topk) == ("cpu", 1)
    with pytest.raises(AttributeError, match="EAGLEWorkerV2 of the release has no attribute 'draft_runner'"):
        release_instance(type(worker), draft_runner=None)  # the draft worker's, not this one's
    pool = release_instance(release_type(tree, "ReqToTokenPool"), req_to_token=[[0, 1]])
    assert pool.req_to_token == [[0, 1]]
    # A property stays the release's: the test gives what it reads.
    with pytest.raises(AttributeError, match="no setter"):
        release_instance(release_type(tree, "TpModelWorker"), model_runner=None)
    assert release_instance(release_type(tree, "TpModelWorker"), _model_runner="runner").model_runner == "runner"

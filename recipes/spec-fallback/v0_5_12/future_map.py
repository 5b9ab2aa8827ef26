"""SGLang 0.5.12: the scheduler's FutureMap reads a decode batch's next draft input as views of
its buffers instead of gathering it.

The FutureMap (managers/overlap_utils.py) stores each step's next draft input (five tensors)
in circular buffers at a contiguous interval of slots, and the next step gathers them back
with `buf[indices]`: five gather kernels per step, where plain decoding's map resolves its
token ids in one. When the indices are still that interval, the gather is a slice: fallback
and speculative steps alike save those kernels.
"""

from sglang.srt.speculative.spec_utils import spec_need_hidden_states


def resolve_hook(self, draft_input):
    if self._resolve_future_as_views(draft_input):
        return


class FutureMap:
    def _resolve_future_as_views(self, draft_input):
        """Point the draft input at its slots when they are the interval it was stored at:
        views, no kernels. A batch filtered since keeps its interval but fewer indices, and a
        merged batch has none: both are gathered as before. (ScheduleBatch.filter_batch does
        nothing when every request is kept, and a filter that keeps fewer, in order or, as
        retract_decode's, reordered, leaves fewer indices than the interval: indices as many
        as the interval are the interval, in its order.)

        Views are safe where copies were: each stored interval is read by one step, and its
        slots are written again only after the circular buffer comes round (three batches
        of the largest size at least), later on the same stream."""
        future = draft_input.future_indices
        interval = future.interval
        if (
            interval is None
            or not self.buf_initialized
            or future.indices.shape[0] != interval.stop - interval.start
        ):
            return False
        draft_input.topk_p = self.topk_p_buf[interval]
        draft_input.topk_index = self.topk_index_buf[interval]
        draft_input.bonus_tokens = self.bonus_tokens_buf[interval]
        draft_input.new_seq_lens = self.new_seq_lens_buf[interval]
        if spec_need_hidden_states():
            draft_input.hidden_states = self.hidden_states_buf[interval]
        return True

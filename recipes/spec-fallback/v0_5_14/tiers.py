"""The tiers' (../tiers.py) hooks and release differences on SGLang 0.5.14 to 0.5.18, where they
differ from 0.5.12's (../v0_5_12/tiers.py).

* Start-up: at the end of EAGLEWorkerV2.init_cuda_graphs, after the fallback's (the workers'
  graphs are built after the workers from 0.5.14; worker.py).
* The decode step's batch is the ScheduleBatch `batch` (from 0.5.13: decode_hook serves 0.5.13
  too, whose other hooks and differences are 0.5.12's).
* The graph runners read their capture sizes from server_args.cuda_graph_config.decode.bs
  (0.5.18: the same config object, through the runtime context) and skip capture when its
  backend is disabled (check_cuda_graph_backend). build_adaptive_runtime_state's own
  cuda_graph_bs argument is not used: the release writes it to cuda_graph_bs_decode, which
  the graph runners do not read once the server arguments are resolved.
* The draft extend is captured at the tier's width (steps + 1 draft tokens per request)
  where the release's runner reads it (_spec_fallback_draft_extend_width, ./worker.py).
"""

import contextlib


def init_hook(self):
    self._spec_tiers_init(self.server_args)


def decode_hook(self, batch):
    self._spec_tiers_select(batch)


class EAGLEWorkerV2:
    def _spec_tiers_graph_sizes(self):
        """The decode CUDA-graph batch sizes the server captures; None with decode CUDA
        graphs disabled."""
        decode = self._target_worker.model_runner.server_args.cuda_graph_config.decode
        if decode.backend == "disabled":  # Backend.DISABLED
            return None
        return list(decode.bs)

    @contextlib.contextmanager
    def _spec_tiers_capturing_at(self, sizes, draft_tokens):
        """The release's graph runners capture at batch sizes `sizes` (none: no capture) and
        the draft extend at `draft_tokens` per request inside the block: the decode phase of
        cuda_graph_config holds `sizes`, and an empty list disables it; all is put back after."""
        phases = {
            id(a.cuda_graph_config.decode): a.cuda_graph_config.decode
            for a in (
                self._target_worker.model_runner.server_args,
                self.draft_worker.draft_runner.server_args,
            )
        }
        saved = [(phase, phase.bs, phase.backend) for phase in phases.values()]
        try:
            for phase, _, backend in saved:
                phase.bs = list(sizes)
                phase.backend = backend if sizes else "disabled"
            with self._spec_fallback_draft_extend_width(draft_tokens):
                yield
        finally:
            for phase, bs, backend in saved:
                phase.bs, phase.backend = bs, backend

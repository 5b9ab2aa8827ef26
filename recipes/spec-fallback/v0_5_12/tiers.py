"""The tiers' (../tiers.py) hooks and release differences on SGLang 0.5.12, which also serve
0.5.13 (whose decode hook takes the ScheduleBatch, ../v0_5_14/tiers.py); the step-count write
also serves 0.5.14 and 0.5.15, whose apply_runtime_state assigns server_args the same way.

* Start-up: in EAGLEWorkerV2.__init__ (and StandaloneWorkerV2's), after the fallback's.
* The graph runners read their capture sizes from server_args.cuda_graph_bs and skip capture
  under server_args.disable_cuda_graph, on the worker's, the target model runner's and the
  draft model runner's server_args (one object or several).
* apply_runtime_state assigns the state's step counts to server_args, from which the
  scheduler sizes each step's KV allocation.
"""

import contextlib


def init_hook(self, server_args):
    self._spec_tiers_init(server_args)


def decode_hook(self, model_worker_batch):
    self._spec_tiers_select(model_worker_batch)


class EAGLEWorkerV2:
    def _spec_tiers_graph_sizes(self):
        """The decode CUDA-graph batch sizes the server captures; None with CUDA graphs off."""
        args = self._target_worker.model_runner.server_args
        return None if args.disable_cuda_graph else list(args.cuda_graph_bs)

    @contextlib.contextmanager
    def _spec_tiers_capturing_at(self, sizes, draft_tokens):
        """The release's graph runners capture at batch sizes `sizes` (none: no capture)
        inside the block: server_args.cuda_graph_bs holds `sizes`, and an empty list sets
        disable_cuda_graph; both are put back after. The draft extend's width,
        `draft_tokens`, is the worker state's, which 0.5.12 writes to server_args itself."""
        holders = {
            id(a): a
            for a in (
                self.server_args,
                self._target_worker.model_runner.server_args,
                self.draft_worker.draft_runner.server_args,
            )
        }
        saved = [(a, a.cuda_graph_bs, a.disable_cuda_graph) for a in holders.values()]
        try:
            for args, _, disabled in saved:
                args.cuda_graph_bs = list(sizes)
                args.disable_cuda_graph = disabled or not sizes
            yield
        finally:
            for args, graph_bs, disabled in saved:
                args.cuda_graph_bs, args.disable_cuda_graph = graph_bs, disabled

    def _spec_tiers_keep_startup_counts(self):
        """apply_runtime_state assigned the state's step counts to server_args: the start-up
        counts go back, whose KV allocation holds every tier's."""
        steps, draft_tokens = self._spec_tiers.startup
        self.server_args.speculative_num_steps = steps
        self.server_args.speculative_num_draft_tokens = draft_tokens

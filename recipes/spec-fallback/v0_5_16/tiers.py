"""Where the tiers keep the start-up step counts on SGLang 0.5.16 to 0.5.18 (../tiers.py;
0.5.12's assignment, ../v0_5_12/tiers.py, serves 0.5.14 and 0.5.15).

apply_runtime_state writes the state's step counts through the release's audited mutation
point: server_args.override on 0.5.16, the runtime context's override (the resolved config
that get_spec() reads) from 0.5.17. The scheduler sizes each step's KV allocation from
server_args on 0.5.16 and 0.5.17 (which 0.5.17's apply_runtime_state leaves alone) and from
get_spec() on 0.5.18, before the tier is known.
"""


class EAGLEWorkerV2:
    def _spec_tiers_keep_startup_counts(self):
        """apply_runtime_state wrote the state's step counts where this release keeps them:
        the start-up counts go back the same way, whose KV allocation holds every tier's."""
        from sglang.srt.runtime_context import get_context

        steps, draft_tokens = self._spec_tiers.startup
        context = get_context()
        if hasattr(context, "override"):  # from 0.5.17
            override = context.override
        else:
            override = self.server_args.override
        override(
            "spec_tiers.startup_counts",
            speculative_num_steps=steps,
            speculative_num_draft_tokens=draft_tokens,
        )

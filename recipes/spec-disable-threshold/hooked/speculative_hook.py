"""The threshold flag on releases that validate speculative arguments in
arg_groups/speculative_hook.py (0.5.13 on) while the worker is still spectool's fallback.

The fields, flags and validation are the classic ones (../classic/server_args_patch.py); only
where the validation is called from moves: SGLang's handle_speculative_decoding, once it has
settled the algorithm, the default max_running_requests and adaptive decoding.
"""


def call_validation(server_args):
    server_args._validate_speculative_disable_threshold()


def call_tiers_validation(server_args):
    server_args._validate_speculative_num_steps_tiers()

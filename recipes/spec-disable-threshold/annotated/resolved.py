"""The threshold flag on 0.5.19+, whose server arguments are settled by a resolution pipeline:
hooks read what has been decided through resolving_view and declare their own decisions
(declare_resolution) instead of writing the fields. The tiers are hook.py's."""


def resolving_view(server_args):  # stand-ins so this file lints; the release defines both
    return server_args


def declare_resolution(server_args, source, **fields):
    return None


def _spectool_adaptive_tiers(cfg):
    return None


def _spectool_threshold_to_adaptive(server_args):
    """spectool: --speculative-disable-batch-size-threshold on upstream's adaptive tiers."""
    path = _spectool_adaptive_tiers(resolving_view(server_args))
    if path is not None:
        declare_resolution(
            server_args,
            "spec-disable-threshold",
            speculative_adaptive=True,
            speculative_adaptive_config=path,
        )


def call_mapping(server_args):
    _spectool_threshold_to_adaptive(server_args)

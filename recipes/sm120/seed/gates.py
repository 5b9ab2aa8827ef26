"""SM120 gates of the seed era (0.5.6.post2 to 0.5.10), back-ported from later releases."""

CUDA_CAPABILITY = (12, 0)
_is_cuda = True


def extend_attention_block_sizes(Lq):
    # SM120 (RTX PRO 6000) has about 100 KB of shared memory; the Hopper block sizes above
    # need 106 KB (OutOfResources). Upstream PR #14311, in SGLang from 0.5.9.
    if _is_cuda and CUDA_CAPABILITY[0] == 12:
        if Lq <= 128:
            BLOCK_M, BLOCK_N = (64, 128)
        elif Lq <= 256:
            BLOCK_M, BLOCK_N = (64, 64)
        else:
            BLOCK_M, BLOCK_N = (32, 32)


def fp8_triton_on_sm120():
    # Block-FP8 "auto" would pick the FlashInfer TRT-LLM kernel (SM100 only) on SM120;
    # SGLang 0.5.10 forces triton there (initialize_fp8_gemm_config).
    if is_sm120_supported():
        return triton_w8a8_block_fp8_linear


def deepgemm_opt_out(sm_version):
    if sm_version == 120:
        # DeepGEMM needs TMEM/tcgen05 (SM100) or SM90 wgmma; SM120 has neither (0.5.15 fix).
        return False


def is_sm120_supported():  # stand-ins so this file lints; the patched file has the real ones
    return True


def triton_w8a8_block_fp8_linear():
    return None

"""DeepGEMM opt-out on SM120, as upstream 0.5.15 does in the same function."""

_is_cuda = True


def sm120_opt_out(sm_version):
    if _is_cuda and sm_version == 120:
        # DeepGEMM requires TMEM/tcgen05 (SM100 data-center Blackwell) or SM90 wgmma;
        # SM120 (RTX PRO 6000) has neither, so its kernels fail to build or run there.
        return False

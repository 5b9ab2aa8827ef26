"""Train the golden model once (CPU is fine, about 30 min on 2 cores) into a cache folder.

    python tools/train_golden_model.py CACHE_DIR [--device cpu|cuda] [--tp N] [--eagle3-head]

`spectool verify --model-cache CACHE_DIR` then uses it instead of training in the run; with
CACHE_DIR golden/models it is the shipped model. `--tp 2` trains the model `verify --tp 2`
uses (an MLP that splits across two ranks: ModelSpec.for_tp). `--eagle3-head` also trains
the EAGLE-3 head on that target's features (spectool/harness/verify/golden_eagle3.py, about 6 min
on 2 cores).
"""

import argparse
from pathlib import Path

from spectool.harness.verify.golden_eagle3 import ensure_models
from spectool.harness.verify.golden_model import ModelSpec

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("cache", type=Path)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--eagle3-head", action="store_true")
    a = ap.parse_args()
    import torch

    torch.set_num_threads(max(1, torch.get_num_threads()))
    spec = ModelSpec().for_tp(a.tp)
    log = lambda m: print(m, flush=True)  # noqa: E731
    info = ensure_models(a.cache, spec, device=a.device, log=log)
    if a.eagle3_head:
        from spectool.harness.verify.golden_eagle3 import ensure_head

        info["eagle3_head"] = str(ensure_head(a.cache, spec, device=a.device, log=log))
    print(info)

"""Train the golden model once (CPU is fine, about 30 min on 2 cores) into a cache folder.

    python tools/train_golden_model.py CACHE_DIR [--device cpu|cuda] [--tp N]

`spectool verify --model-cache CACHE_DIR` then uses it instead of training in the run; with
CACHE_DIR golden/models it is the shipped model. `--tp 2` trains the model `verify --tp 2`
uses (an MLP that splits across two ranks: ModelSpec.for_tp).
"""

import argparse
from pathlib import Path

from spectool.verify.golden_model import ModelSpec, ensure_models

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("cache", type=Path)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tp", type=int, default=1)
    a = ap.parse_args()
    import torch

    torch.set_num_threads(max(1, torch.get_num_threads()))
    info = ensure_models(a.cache, ModelSpec().for_tp(a.tp), device=a.device, log=lambda m: print(m, flush=True))
    print(info)

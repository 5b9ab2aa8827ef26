"""Re-read a recorded `spectool bench --profile` run from its trace excerpts (no GPU).

Each profile leaves the middle two steps of every trace, every event, in `excerpts/`
(`ARM-C64.trace.json.gz`, `ARM-C64-2...` for the second profile of that C on the same
engines). This reduces them again with the current bench/profile.py, decode-step anatomy
included (the kernels between two forwards, by name), and writes `excerpts.md` beside them:

    python tools/reread_profile.py results/profile-0.5.12-s16-lockstep
"""

import sys
from pathlib import Path

from spectool.harness.bench import profile


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not (Path(argv[0]) / "excerpts").is_dir():
        print("usage: python tools/reread_profile.py PROFILE_FOLDER  (one with an excerpts/ folder)", file=sys.stderr)
        return 2
    folder = Path(argv[0])
    rows = profile.reread_excerpts(folder)
    text = ("Re-read from the two-step trace excerpts (`excerpts/`) by tools/reread_profile.py: per-step figures "
            "over two steps, for what the excerpts show; `profile.md` has the whole profiled windows.\n\n"
            + profile.markdown(rows))
    (folder / "excerpts.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

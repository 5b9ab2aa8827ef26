"""Re-read a recorded `spectool bench --profile` run from its trace excerpts (no GPU).

Each profile leaves the middle two steps of every trace, every event, in `excerpts/`
(`ARM-C64.trace.json.gz`, `ARM-C64-2...` for the second profile of that C on the same
engines). This reduces them again with the current bench/profile.py, decode-step anatomy
included (the kernels between two forwards, by name), and writes `excerpts.md` beside them:

    python tools/reread_profile.py results/profile-0.5.12-s16-lockstep
"""

import re
import sys
from pathlib import Path

from spectool.bench import profile

NAME = re.compile(r"^(?P<arm>[A-Za-z0-9]+)-C(?P<C>\d+)(?:-(?P<wave>\d+))?\.trace\.json(?:\.gz)?$")


def reread(folder: Path) -> dict:
    """(arm, C, k) -> summarize() of each excerpt, k counting the earlier profiles of that C."""
    rows = {}
    for path in sorted((folder / "excerpts").glob("*.trace.json*")):
        m = NAME.match(path.name)
        if not m:
            continue
        k = int(m["wave"]) - 1 if m["wave"] else 0
        rows[(m["arm"], int(m["C"]), k)] = profile.summarize(profile.load_events(path), steps=2)
    return rows


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not (Path(argv[0]) / "excerpts").is_dir():
        print("usage: python tools/reread_profile.py PROFILE_FOLDER  (one with an excerpts/ folder)", file=sys.stderr)
        return 2
    folder = Path(argv[0])
    rows = reread(folder)
    text = ("Re-read from the two-step trace excerpts (`excerpts/`) by tools/reread_profile.py: per-step figures "
            "over two steps, for what the excerpts show; `profile.md` has the whole profiled windows.\n\n"
            + profile.markdown(rows))
    (folder / "excerpts.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Derive benchmarks/data/gavel/throughputs.csv from Gavel's measured throughputs.

Gavel (stanford-futuredata/gavel, MIT) ships `scheduler/simulation_throughputs.json`:
{gpu type: {"('<model> (batch size <b>)', <scale factor>)": {"null": steps/s alone, ...}}}.
We keep what a single GPU of each type does alone (scale factor 1, key "null"), per model and
batch size, for the types measured on every row (k80, p100, v100).

    python -m benchmarks.gavel_speeds PATH/TO/simulation_throughputs.json > benchmarks/data/gavel/throughputs.csv
"""

from __future__ import annotations

import ast
import json
import re
import sys

TYPES = ("k80", "p100", "v100")


def rows(doc: dict[str, dict[str, dict[str, object]]]) -> list[tuple[str, int, list[float]]]:
    out = []
    for key in doc["v100"]:
        name, scale = ast.literal_eval(key)
        if scale != 1 or any(key not in doc[t] for t in TYPES):
            continue
        m = re.fullmatch(r"(.+?) \(batch size (\d+)\)", name)
        model, batch = (m.group(1), int(m.group(2))) if m else (name, 0)
        out.append((model, batch, [float(doc[t][key]["null"]) for t in TYPES]))  # type: ignore[arg-type]
    return sorted(out)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        doc = json.load(f)
    print("model,batch_size," + ",".join(TYPES))
    for model, batch, tps in rows(doc):
        print(f"{model},{batch}," + ",".join(f"{x:.4f}" for x in tps))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

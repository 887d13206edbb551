"""The release tables of docs/performance.md between sessions (lab only): what changed from one
table to its retake, and the swap of retaken tables into the docs with the old ones moved to
dev/tables-history.md.

    python3 dev/tables.py extract H100 "4096-wide layers" > old.md
    python3 dev/tables.py diff old.md new.md
    python3 dev/tables.py swap --heading "HEADING" --intro intro.md --subtitle "before abc1234" \\
        "H100:4096-wide layers=/path/bench_small.md" "H100:Llama-3-8B decode step=/path/step_8b.md"

A table is a `#### NAME` section under a `### GPU` heading (the text up to the next heading). `diff`
compares `w4 bench` markdown: each layer cell's w4 time, how many moved by at most 2%, the cells
of M >= 16 below fp16, and the decode step's rows (fp16, w4 with PDL, ratio).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS, HISTORY = ROOT / "docs" / "performance.md", ROOT / "dev" / "tables-history.md"


def section(lines: list[str], gpu: str, name: str) -> tuple[int, int]:
    """[start, end) of the body of `#### name` under `### gpu`."""
    top = lines.index(f"### {gpu}")
    head = next(i for i in range(top, len(lines)) if lines[i] == f"#### {name}")
    end = next((i for i in range(head + 1, len(lines)) if re.match(r"#{2,4} ", lines[i])), len(lines))
    return head + 1, end


def number(text: str) -> float:
    return float(text.replace(",", ""))


def parse(text: str) -> tuple[dict, dict]:
    """Layer cells {(shape, M): (fp16 us, w4 us)} (first table of each) and decode-step rows
    {M: (fp16 ms, w4 with PDL ms, ratio)}."""
    cells, steps = {}, {}
    for line in text.splitlines():
        p = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(p) >= 9 and re.fullmatch(r"\d+x\d+", p[0]) and p[2].isdigit() and p[3] and p[4]:
            cells.setdefault((p[0], int(p[2])), (number(p[3]), number(p[4])))
        elif len(p) == 11 and p[0].isdigit() and p[9].endswith("x"):
            steps[int(p[0])] = (number(p[1]), number(p[8]), p[9])
    return cells, steps


def diff(old_path: str, new_path: str, within: float = 2.0) -> None:
    (old, old_steps), (new, new_steps) = parse(Path(old_path).read_text()), parse(Path(new_path).read_text())
    moved, below, same = [], [], 0
    for key in sorted(new, key=lambda k: (k[0], k[1])):
        fp16, w4 = new[key]
        if key in old:
            fp16_0, w4_0 = old[key]
            change = (w4 / w4_0 - 1) * 100
            print(f"{key[0]} M={key[1]}: fp16 {fp16_0} -> {fp16} ({(fp16 / fp16_0 - 1) * 100:+.1f}%), "
                  f"w4 {w4_0} -> {w4} ({change:+.1f}%), {fp16_0 / w4_0:.2f}x -> {fp16 / w4:.2f}x")
            if abs(change) <= within:
                same += 1
            else:
                moved.append(f"{key[0]} M={key[1]} {change:+.1f}%")
        if key[1] >= 16 and fp16 < w4:
            below.append(f"{key[0]} M={key[1]} {fp16 / w4:.2f}x")
    print(f"w4 within {within:g}% on {same} of {len(set(new) & set(old))} cells; beyond: {', '.join(moved) or 'none'}")
    print(f"below fp16 at M >= 16: {len(below)}: {', '.join(below) or 'none'}")
    for m in sorted(new_steps):
        print(f"step M={m}: {old_steps.get(m)} -> {new_steps[m]} (fp16 ms, w4 with PDL ms, ratio)")


def swap(heading: str, intro: str, subtitle: str, tables: list[str], docs: Path, history: Path) -> None:
    """Each "GPU:NAME=FILE" replaces that table in `docs`; the old ones go to the end of `history`
    under `## heading`, the intro's text, then `### GPU tables, subtitle` per GPU."""
    lines = docs.read_text().split("\n")
    wanted = []
    for spec in tables:
        where, _, path = spec.partition("=")
        gpu, _, name = where.partition(":")
        wanted.append((gpu, name, Path(path).read_text().strip("\n")))
    old = {}
    # from the bottom up, so that earlier sections' line numbers stay valid
    for gpu, name, body in sorted(wanted, key=lambda t: -section(lines, t[0], t[1])[0]):
        start, end = section(lines, gpu, name)
        old[(gpu, name)] = "\n".join(lines[start:end]).strip("\n")
        lines[start:end] = ["", *body.split("\n"), ""]
    out = [f"## {heading}", "", Path(intro).read_text().strip("\n"), ""]
    for gpu in dict.fromkeys(g for g, _, _ in wanted):
        out += [f"### {gpu} tables, {subtitle}", ""]
        for g, name, _ in wanted:
            if g == gpu:
                out += [f"#### {name}", "", old[(g, name)], ""]
    docs.write_text("\n".join(lines))
    history.write_text(history.read_text().rstrip("\n") + "\n\n" + "\n".join(out).rstrip("\n") + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("extract")
    ex.add_argument("gpu")
    ex.add_argument("name")
    df = sub.add_parser("diff")
    df.add_argument("old")
    df.add_argument("new")
    df.add_argument("--within", type=float, default=2.0)
    sw = sub.add_parser("swap")
    sw.add_argument("--heading", required=True)
    sw.add_argument("--intro", required=True, help="a file with the history section's text")
    sw.add_argument("--subtitle", required=True, help='e.g. "the permute kernel before 77b5fe1"')
    sw.add_argument("--docs", type=Path, default=DOCS)
    sw.add_argument("--history", type=Path, default=HISTORY)
    sw.add_argument("tables", nargs="+", help='"GPU:NAME=FILE"')
    args = ap.parse_args()
    if args.command == "extract":
        lines = DOCS.read_text().split("\n")
        start, end = section(lines, args.gpu, args.name)
        sys.stdout.write("\n".join(lines[start:end]).strip("\n") + "\n")
    elif args.command == "diff":
        diff(args.old, args.new, args.within)
    else:
        swap(args.heading, args.intro, args.subtitle, args.tables, args.docs, args.history)


if __name__ == "__main__":
    main()

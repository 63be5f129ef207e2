"""The training corpus of the built-in model: the King James Bible as printed by
Debian's `bible` program (packages bible-kjv + bible-kjv-text), cleaned to one
verse per line, and the fixed train / held-out split.

`bible 'Gen1:1-Rev22:21'` prints, per chapter, a blank line, a heading such as
"1 Samuel 3", a blank line, then the verses: each starts with spaces and its
number ("  12 And ..."), long verses wrap onto lines without indentation. The
cleaner keeps the verse text only (number and headings dropped, wrapped lines
joined with one space), one verse per line, '\n'-terminated, ASCII.

Split: chapters are numbered 1..1189 in canonical order (Genesis 1 = 1,
Revelation 22 = 1189); every 50th chapter (50, 100, ..., 1150: 23 chapters) is
held out for evaluation, everything else is training text.

CLI:  /usr/bin/python3 tools/corpus.py OUT.txt [--split all|train|heldout]
      (reads `bible` itself; --raw FILE reads a saved `bible` output instead)
"""
import argparse
import re
import subprocess
import sys

BIBLE_RANGE = "Gen1:1-Rev22:21"
N_CHAPTERS = 1189
HELDOUT_EVERY = 50

_HEADING = re.compile(r"^(?:[123] )?[A-Z][A-Za-z ]*[a-z] \d+$")
_VERSE = re.compile(r"^ +(\d+) (.*)$")


def read_bible():
    """The raw text of the whole Bible from the `bible` program."""
    out = subprocess.run(["bible", BIBLE_RANGE], check=True, stdout=subprocess.PIPE)
    return out.stdout.decode("ascii")


def parse_chapters(raw):
    """Returns [(heading, [verse, ...]), ...] in canonical order."""
    chapters = []
    verse = None
    prev_blank = True
    for line in raw.split("\n"):
        line = line.rstrip()
        if not line:
            prev_blank = True
            continue
        if prev_blank and _HEADING.match(line):
            chapters.append((line, []))
            verse = None
        else:
            m = _VERSE.match(line)
            if m:
                if not chapters:
                    raise ValueError(f"verse before any chapter heading: {line!r}")
                verses = chapters[-1][1]
                if int(m.group(1)) != len(verses) + 1:
                    raise ValueError(f"{chapters[-1][0]}: verse {m.group(1)} out of order")
                verses.append(m.group(2).strip())
                verse = verses
            elif verse is not None:
                verse[-1] = verse[-1] + " " + line.strip()
            else:
                raise ValueError(f"text outside a verse: {line!r}")
        prev_blank = False
    if len(chapters) != N_CHAPTERS:
        raise ValueError(f"expected {N_CHAPTERS} chapters, found {len(chapters)}")
    return chapters


def is_heldout(chapter_number):
    """chapter_number: 1-based canonical index."""
    return chapter_number % HELDOUT_EVERY == 0


def clean(raw, split="all"):
    """The cleaned text (one verse per line) of the split: all|train|heldout."""
    assert split in ("all", "train", "heldout")
    lines = []
    for n, (_, verses) in enumerate(parse_chapters(raw), start=1):
        if split == "all" or (split == "heldout") == is_heldout(n):
            lines.extend(verses)
    text = "\n".join(" ".join(v.split()) for v in lines) + "\n"
    text.encode("ascii")  # the byte tokenizer sees ASCII only
    return text


def heldout_chapters(raw):
    return [h for n, (h, _) in enumerate(parse_chapters(raw), start=1) if is_heldout(n)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--split", default="all", choices=["all", "train", "heldout"])
    ap.add_argument("--raw", help="saved output of `bible 'Gen1:1-Rev22:21'` (default: run it)")
    args = ap.parse_args()
    raw = open(args.raw).read() if args.raw else read_bible()
    text = clean(raw, args.split)
    with open(args.out, "w") as f:
        f.write(text)
    print(f"{args.out}: {args.split}, {text.count(chr(10))} verses, {len(text)} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()

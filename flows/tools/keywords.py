#!/usr/bin/env python3
"""Extract the most frequent keywords of a document (deterministic, no dependencies).

Used by `flows/document-extraction.yaml` as a `command` agent: Switchyard writes the step's
input document as JSON on stdin and reads one JSON value from stdout.

Input (stdin):   {"texts": ["page one text", "page two text", ...]}
Output (stdout): {"keywords": [{"word": "invoice", "count": 4}, ...]}

Arguments: `--top N` (default 10) keywords, most frequent first, ties in alphabetical order.
Words are lower-cased runs of letters (3 or more), minus common English stop words.

Try it:
    echo '{"texts": ["Invoice for ACME", "ACME pays the invoice"]}' | python3 flows/tools/keywords.py --top 2
"""

import argparse
import collections
import json
import re
import sys

STOP_WORDS = frozenset(
    """
    about above after again against all also and any are because been before being below
    between both but can could did does doing down during each few for from further had has
    have having her here hers herself him himself his how into its itself just more most
    not now off once only other our ours ourselves out over own same she should some such
    than that the their theirs them themselves then there these they this those through too
    under until very was were what when where which while who whom why will with would you
    your yours yourself yourselves per may shall
    """.split()
)

WORD = re.compile(r"[^\W\d_]{3,}")


def keywords(texts, top):
    counts = collections.Counter()
    for text in texts:
        for word in WORD.findall(text.lower()):
            if word not in STOP_WORDS:
                counts[word] += 1
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return [{"word": w, "count": c} for w, c in ranked[:top]]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=10)
    args = parser.parse_args()
    try:
        doc = json.load(sys.stdin)
        texts = doc["texts"]
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise ValueError("`texts` must be a list of strings")
    except (ValueError, KeyError, TypeError) as e:
        print(f"keywords: invalid input: {e!r}", file=sys.stderr)
        return 2
    json.dump({"keywords": keywords(texts, max(args.top, 0))}, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

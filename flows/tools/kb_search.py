#!/usr/bin/env python3
"""Search a small help-center knowledge base (deterministic, no network, no dependencies).

Used by `flows/support-triage-agent.yaml` as a `command` tool of its agent loop: the model's
arguments arrive as JSON on stdin, the result goes to stdout as one JSON value, and the loop
shows it to the model. Swap ARTICLES (or `search()`) for your help center's search API; keep
the stdin/stdout contract.

Input (stdin):   {"query": "charged twice", "limit": 3}
Output (stdout): {"articles": [{"id": "KB-12", "title": "...", "url": "...", "excerpt": "..."}]}

Articles are ranked by how many of the query's words (3 letters or more, lower-cased) they
contain (common English words aside) in their title, tags and text, ties by id; articles that match no word are left out.
`limit` is 1 to 10 (default 3). Invalid input exits with status 2 and a message on stderr (the
loop then tells the model the tool failed).

Try it:
    echo '{"query": "refund for a double charge"}' | python3 flows/tools/kb_search.py
"""

import json
import re
import sys

ARTICLES = [
    {
        "id": "KB-12",
        "title": "Why was I charged twice?",
        "tags": ["billing", "charge", "duplicate", "pre-authorisation"],
        "text": "A second charge of the same amount is usually a pre-authorisation that your bank "
        "releases within 5 business days. If both charges are still there after 5 days, we "
        "refund the duplicate.",
    },
    {
        "id": "KB-19",
        "title": "Refund policy",
        "tags": ["billing", "refund", "cancel", "invoice"],
        "text": "Annual plans can be refunded in full within 30 days of the invoice; monthly "
        "plans are not refunded but can be cancelled at any time. Refunds reach the card in "
        "5 to 10 business days.",
    },
    {
        "id": "KB-31",
        "title": "Resetting two-factor authentication",
        "tags": ["account", "login", "2fa", "password"],
        "text": "If you lost your authenticator, use one of your recovery codes on the login page. "
        "Without recovery codes, an administrator of your workspace can reset 2FA for you.",
    },
    {
        "id": "KB-44",
        "title": "CSV export fails or times out",
        "tags": ["technical", "export", "csv", "timeout"],
        "text": "Exports of more than 100,000 rows run in the background: you get an email with a "
        "download link when the file is ready. Narrow the date range for an instant download.",
    },
]

WORD = re.compile(r"[^\W_]{3,}")
STOP_WORDS = frozenset(
    "and are but can for from has have how not our that the this was what why with you your".split()
)


def words(text):
    return set(WORD.findall(text.lower())) - STOP_WORDS


def search(query, limit):
    wanted = words(query)
    scored = []
    for a in ARTICLES:
        have = words(" ".join([a["title"], " ".join(a["tags"]), a["text"]]))
        score = len(wanted & have)
        if score:
            scored.append((-score, a["id"], a))
    scored.sort(key=lambda s: (s[0], s[1]))
    return [
        {
            "id": a["id"],
            "title": a["title"],
            "url": f"https://help.example.com/kb/{a['id'][3:]}",
            "excerpt": a["text"],
        }
        for _, _, a in scored[:limit]
    ]


def main():
    try:
        doc = json.load(sys.stdin)
        query = doc["query"]
        limit = doc.get("limit", 3)
        if not isinstance(query, str) or not query.strip():
            raise ValueError("`query` must be a non-empty string")
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= 10:
            raise ValueError("`limit` must be an integer from 1 to 10")
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        print(f"kb_search: invalid input: {e!r}", file=sys.stderr)
        return 2
    json.dump({"articles": search(query, limit)}, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

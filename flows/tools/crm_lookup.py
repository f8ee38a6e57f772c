#!/usr/bin/env python3
"""Look up a customer: plan, tier, recent invoices (deterministic, no network, no dependencies).

Used by `flows/support-triage-agent.yaml` as a `command` tool of its agent loop: the model's
arguments arrive as JSON on stdin, the customer goes to stdout as one JSON value. Swap
CUSTOMERS (or `lookup()`) for a call to your CRM; keep the stdin/stdout contract.

Input (stdin):   {"customer_id": "C-9"}
Output (stdout): {"found": true, "customer": {"id": "C-9", "name": "...", "tier": "pro",
                  "plan": "annual", "invoices": [{"id": "INV-2041", "amount_usd": 480, ...}]}}
                 {"found": false, "customer_id": "C-404"}    (an unknown id is an answer, not an error)

Invalid input exits with status 2 and a message on stderr (the loop then tells the model the
tool failed).

Try it:
    echo '{"customer_id": "C-9"}' | python3 flows/tools/crm_lookup.py
"""

import json
import sys

CUSTOMERS = {
    "C-9": {
        "name": "Dana Whitfield",
        "tier": "pro",
        "plan": "annual",
        "invoices": [
            {"id": "INV-2041", "date": "2026-11-02", "amount_usd": 480, "status": "paid"},
            {"id": "INV-2042", "date": "2026-11-02", "amount_usd": 480, "status": "paid"},
        ],
    },
    "C-3": {
        "name": "Ravi Menon",
        "tier": "free",
        "plan": "none",
        "invoices": [],
    },
    "C-21": {
        "name": "Northwind Traders",
        "tier": "enterprise",
        "plan": "annual",
        "invoices": [
            {"id": "INV-1980", "date": "2026-06-15", "amount_usd": 12000, "status": "paid"},
        ],
    },
}


def lookup(customer_id):
    c = CUSTOMERS.get(customer_id)
    if c is None:
        return {"found": False, "customer_id": customer_id}
    return {"found": True, "customer": {"id": customer_id, **c}}


def main():
    try:
        doc = json.load(sys.stdin)
        customer_id = doc["customer_id"]
        if not isinstance(customer_id, str) or not customer_id:
            raise ValueError("`customer_id` must be a non-empty string")
    except (ValueError, KeyError, TypeError) as e:
        print(f"crm_lookup: invalid input: {e!r}", file=sys.stderr)
        return 2
    json.dump(lookup(customer_id), sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Report the status of a long-running job (a deterministic simulation).

Used by `flows/job-polling.yaml` as a `command` agent: Switchyard writes the step's input
document as JSON on stdin and reads one JSON value from stdout. Swap the body of `status()`
for a call to your scheduler's API; keep the stdin/stdout contract.

Input (stdin):
    {"job": {"id": "J-1042", "polls_needed": 3}, "poll": 0}

    job.id            the job to ask about (required)
    job.polls_needed  optional: how many polls until the simulated job is done; by default it
                      is derived from the id, so the same id always behaves the same way
    poll              how many times the flow has already polled (the `while` loop's `iteration`)

Output (stdout):
    {"id": "J-1042", "state": "running", "progress": 33, "polls": 1}
    {"id": "J-1042", "state": "done", "progress": 100, "polls": 3,
     "result_url": "https://jobs.example.com/J-1042/result.json"}
    {"id": "fail-7", "state": "failed", "progress": 50, "polls": 2,
     "error": "worker exited with code 137 (out of memory)"}

Jobs whose id starts with `fail` fail on their second poll. Invalid input exits with status 2
and a message on stderr (the flow sees a failure of kind `agent`).

Try it:
    echo '{"job": {"id": "J-1042"}, "poll": 0}' | python3 flows/tools/job_status.py
"""

import json
import sys
import zlib


def polls_needed(job):
    given = job.get("polls_needed")
    if given is not None:
        if not isinstance(given, int) or isinstance(given, bool) or given < 1:
            raise ValueError("`job.polls_needed` must be a positive integer")
        return given
    # Stable across runs and machines (unlike hash()): 2 to 4 polls.
    return 2 + zlib.crc32(job["id"].encode("utf-8")) % 3


def status(job, poll):
    polls = poll + 1
    if job["id"].startswith("fail"):
        if polls >= 2:
            return {
                "id": job["id"],
                "state": "failed",
                "progress": 50,
                "polls": polls,
                "error": "worker exited with code 137 (out of memory)",
            }
        return {"id": job["id"], "state": "running", "progress": 50, "polls": polls}
    needed = polls_needed(job)
    if polls >= needed:
        return {
            "id": job["id"],
            "state": "done",
            "progress": 100,
            "polls": polls,
            "result_url": f"https://jobs.example.com/{job['id']}/result.json",
        }
    return {"id": job["id"], "state": "running", "progress": polls * 100 // needed, "polls": polls}


def main():
    try:
        doc = json.load(sys.stdin)
        job = doc["job"]
        if not isinstance(job.get("id"), str) or not job["id"]:
            raise ValueError("`job.id` must be a non-empty string")
        poll = doc.get("poll", 0)
        if not isinstance(poll, int) or isinstance(poll, bool) or poll < 0:
            raise ValueError("`poll` must be a non-negative integer")
        out = status(job, poll)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        print(f"job_status: invalid input: {e!r}", file=sys.stderr)
        return 2
    json.dump(out, sys.stdout, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Test helper: run callables in threads of their own (shared by the graph and lifetime tests)."""

from __future__ import annotations

import threading


def run_threads(*fns, timeout=120):
    """Run each ``fn`` in its own thread; re-raise the first error; return their results in order."""
    results, errors = [None] * len(fns), []

    def target(i, fn):
        try:
            results[i] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=target, args=(i, fn)) for i, fn in enumerate(fns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    if errors:
        raise errors[0]
    return results

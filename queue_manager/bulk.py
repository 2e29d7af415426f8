"""The backlog of bulk requests: those whose queries are not all admitted to a pool yet, oldest first."""

from __future__ import annotations

from collections import deque

from queue_manager.pool import Request


class BulkBacklog:
    """FIFO of bulk requests; `waiting` counts their queries not yet admitted.

    Only the oldest request takes slots: a later one never gets ahead of it, so each request's
    wait is bounded by the work accepted before it (no starvation among bulk requests).
    """

    def __init__(self) -> None:
        self.requests: deque[Request] = deque()
        self.waiting = 0

    def __bool__(self) -> bool:
        return bool(self.requests)

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def head(self) -> Request:
        return self.requests[0]

    def allows(self, wanted: int, bound: int) -> bool:
        """Whether a bulk request of `wanted` queries may join. The first always may: a request is
        never refused for its size alone, only for the bulk work already waiting."""
        return not self.requests or self.waiting + wanted <= bound

    def add(self, request: Request) -> None:
        self.requests.append(request)
        self.waiting += request.n - request.admitted

    def took(self, request: Request, count: int) -> None:
        """`count` more of the head request's queries were admitted; it leaves once all were."""
        request.admitted += count
        self.waiting -= count
        if request.admitted == request.n:
            self.requests.popleft()
            request.sequences = None

    def discard(self, request: Request) -> bool:
        """Forget a request that failed or whose caller left; False when it was not waiting."""
        try:
            self.requests.remove(request)
        except ValueError:
            return False
        self.waiting -= request.n - request.admitted
        request.sequences = None
        return True

    def clear(self) -> list[Request]:
        requests = list(self.requests)
        self.requests.clear()
        self.waiting = 0
        for request in requests:
            request.sequences = None
        return requests

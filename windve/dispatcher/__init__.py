"""The dispatcher: the one owner of the queue manager, its depths and the engine processes.

Front ends reach it through a `Dispatcher` client: `LocalDispatcher` when it lives in the
front end's own process (one front end: small machines), `RemoteDispatcher` over a Unix socket when
several front-end processes share it (`DispatcherServer` runs in the `windve serve` parent).
Both answer the same calls, so the front end's request path is one.
"""

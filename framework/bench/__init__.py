"""``hetero bench``: the benchmark harness, kept out of the runtime packages (server, engine,
scheduler, cache). Each benchmark measures hetero side by side with a baseline in the same run
and reports ratios: serving against an in-process loop and a plain FastAPI server
(:mod:`.serve`), scheduling decisions against a naive reference (:mod:`.scheduler`), feature
cache reads against raw redis-py and LMDB reads (:mod:`.cache`). The peers harness's
``/embed`` and ``/vision`` routes live here too (:mod:`.peer_routes`), mounted only when a
policy sets ``server.peer_routes``."""

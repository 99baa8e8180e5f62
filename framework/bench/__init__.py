"""``hetero bench``: the benchmark harness, kept out of the runtime packages (server, engine,
scheduler, cache). Each benchmark measures hetero side by side with a baseline in the same run
and reports ratios: serving against an in-process loop and a plain FastAPI server
(:mod:`.serve`), scheduling decisions against a naive reference (:mod:`.scheduler`), feature
cache reads against raw redis-py and LMDB reads (:mod:`.cache`). Nothing in the product imports
it but the CLI's ``hetero bench`` (the import contract in pyproject.toml). The peers harness's
``/embed`` and ``/vision`` routes are an API the server answers, so they live there
(:mod:`hetero.framework.server.peer_api`), mounted only when a policy sets
``server.peer_routes``."""

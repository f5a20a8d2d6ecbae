"""Getting simgraph onto a cluster: a ``simgraph submit`` job — its command checked
(`jobs.py`), what it ships and refuses (`package.py`), the cluster's shape check, the
submission and its logs (`cluster.py`) — and the offline install kit for GPU nodes without
network — what it carries and how pip gets it (`wheels.py`), the kit's files (`offline_kit.py`),
its proof in a clean venv without network (`kit_check.py`). `pipelines/submit.py` and
`pipelines/offline_kit.py` drive them."""

"""The control-plane test tier: the real Kubernetes API server and the upstream controllers and webhooks
the stacks install, built from their Go modules and run as local processes, so that their code judges
the objects the stacks and the pipeline's steps create (docs/development.md#the-control-plane-tier).

- components.py: what runs, at which version, and where each version comes from (the stacks' pins).
- build.py: each component built from the Go module proxy into Go's own caches
  (`python -m tools.control_plane.build`).
- cluster.py, pki.py, upstream.py: the running tier (etcd, kube-apiserver, the controller manager and
  the scheduler, the controllers with their webhooks).
- nodes/: its nodes, a module per kind (KWOK's simulated ones, the real one) and the real node's images.
- __main__.py: `python -m tools.control_plane test` runs tests/cluster/ in a network namespace of its
  own; `... up` starts the tier for a look around.
"""

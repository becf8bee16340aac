"""Pulumi components, one per concern, each a ComponentResource with a dataclass of arguments: the
clusters (k3d, GKE), images (local, Artifact Registry), the platform (training operator, Argo,
cert-manager, KServe), storage (PVC, GCS), identities, the pipeline's resources, serving and
monitoring. The stacks (stacks/) compose them. Imports neither TensorFlow nor stacks/.
"""

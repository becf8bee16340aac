"""Pulumi components, one per concern: the k3d cluster, images, the platform (training operator,
Argo, cert-manager, KServe), storage, the pipeline's resources and serving. `render` runs a stack
under Pulumi mocks and writes what it declares; `policies` checks it. Never imports TensorFlow.
"""

"""Pulumi components: cluster, platform (training operator, Argo, KServe), storage, pipeline, serving.

Not built yet: see the infrastructure issues. Must not import TensorFlow.
"""

"""The KServe-protocol model server for the published model (v1 and v2, dynamic batching, version
switching, metrics, request logging), its client, load test and logger sink, and the rollout of an
InferenceService to one version on a cluster. Imports neither Pulumi nor the pipeline.
"""

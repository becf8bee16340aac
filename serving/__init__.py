"""The KServe-protocol model server for the published model (v1 and v2, dynamic batching, version
switching, metrics, request logging), its client, load test and logger sink; and the cluster steps
that run in its image: an InferenceService rolled out to one version (rollout) and a TFJob watched
to its end (tfjob_step). Imports neither Pulumi nor the pipeline.
"""

"""The KServe-protocol model server for the published model (v1 and v2, dynamic batching, version
switching, metrics, request logging) and its client tools: the client, the load test, the logger
sink, and the canary's decision on the servers' metrics. Imports neither Pulumi nor the pipeline.
"""

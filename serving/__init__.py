"""The KServe-protocol model server for the published model, its client, load test and logger sink.

Not built yet: see the serving issue. Must not import Pulumi.
"""

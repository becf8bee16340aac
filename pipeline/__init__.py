"""One definition of ingest -> train -> select -> serve, run as local processes or rendered for Argo.

Not built yet: see the pipeline issue. Imports neither Pulumi nor TensorFlow.
"""

"""One definition of ingest -> train -> select -> serve, run as local processes or rendered for Argo.

Imports neither Pulumi nor TensorFlow: the Pulumi program renders the same definition.
"""

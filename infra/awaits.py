"""Annotations that change how `pulumi up` waits on a Kubernetes object."""

# Declare the object and move on. For objects that become ready only when the pipeline has run: a
# claim that local-path binds on its first pod, an InferenceService with no model yet, a Workflow run.
SKIP_AWAIT = {"pulumi.com/skipAwait": "true"}

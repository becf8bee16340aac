"""The steps the Argo workflow runs against the Kubernetes API, in the serving image: a TrainJob (or,
with `pipeline.engine: tfjob`, a TFJob) created and watched to its end (train), an InferenceService
rolled out and its canary judged, promoted or rolled back (release). `names` is what the stacks, the
workflow and these steps share; it imports nothing, so the Pulumi program and the policy pack read it
in their own environments. Imports neither
Pulumi, TensorFlow nor the pipeline.
"""

"""The Pulumi program (Pulumi.yaml's `main`): parses the stack config once (config.py) and composes
infra/'s components for the stack's cluster (local.py). Never imports TensorFlow.
"""

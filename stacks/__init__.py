"""The Pulumi program (Pulumi.yaml's `main`): parses the stack config and composes infra/.

Not built yet: see the infrastructure issues. Must not import TensorFlow.
"""

"""The Pulumi program (Pulumi.yaml's `main`): parses the stack config once (config.py), then composes
infra/'s components the same way for every cluster kind (compose.py), what differs per kind living in
kinds/. `render` runs it under Pulumi mocks; `policies` checks what it declares. Never imports
TensorFlow.
"""

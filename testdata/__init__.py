"""The tests' pinned data: upstream CRDs fetched by URL and SHA-256 (`make fixtures`), the in-repo
Fashion-MNIST sample's checksums, and the CRD validator the tests use. Nothing here is imported by
the trainer, the server, the pipeline or the stacks."""

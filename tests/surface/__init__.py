"""What users and clusters touch: the gRPC server, the CLI and `scaler check`, the engine's
scheduling, the companion, TLS, the manifests, the image, the package and the docs."""

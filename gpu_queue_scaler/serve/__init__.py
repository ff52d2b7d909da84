"""Where decisions are applied: the gRPC external scaler KEDA calls, the HTTP endpoints
(/metrics, /decisions), TLS. Every RPC reads the engine's memory; none reads a metric."""

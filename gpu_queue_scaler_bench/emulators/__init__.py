"""KEDA's and the HPA's side, emulated: a KEDA-like gRPC client and the HPA's arithmetic."""

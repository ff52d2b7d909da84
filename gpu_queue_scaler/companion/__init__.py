"""The Karpenter companion: the scaler's forecasts -> GPU node capacity."""

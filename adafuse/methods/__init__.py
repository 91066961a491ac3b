"""Ensemble methods that `adafuse.Ensemble(method=...)` dispatches to, one module per method."""

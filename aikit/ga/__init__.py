"""Per-framework packages: import `aikit.ga.Torch` or `aikit.ga.TF`."""

"""Speed benchmarks of the legacy TF1 programs and their modern TF2 twins (not parity checks)."""

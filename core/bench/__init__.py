"""byteps-bench: the performance instrument of byteps (issue 4)."""

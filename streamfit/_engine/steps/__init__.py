"""Step strategies: the step graphs and what runs them (fused, forward/backward, row-sparse tables)."""

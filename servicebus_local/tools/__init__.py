"""Developer tools around the local namespace (not part of the distribution: see pyproject.toml)."""

"""Side-by-side benchmarks; every ``attnlab bench`` command writes one JSON schema."""

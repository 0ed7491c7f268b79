"""Small shared helpers (numerics for tests, atomic file writes, logging)."""

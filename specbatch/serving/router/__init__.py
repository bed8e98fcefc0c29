"""The router process: structural classification and a length prior, no torch."""

"""Leaderboards: a competition's ranking rebuilt from its results folders and its competition file."""

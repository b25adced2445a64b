"""The change feed: its rows and cursors, the horizon that keeps it gap-free, its reader."""

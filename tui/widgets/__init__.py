"""Widgets of the explorer: head tree, status bar, cached plotext charts, tab panes."""

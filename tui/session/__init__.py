"""UI state that does not need Textual (compare, timeline, explorer state): testable alone.
"""

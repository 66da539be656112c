"""The ``headscope`` command line: one module per command or concern.
"""

"""The notebook and CLI facade: JSON-ready reports and the ``Model`` methods.
"""

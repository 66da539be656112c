"""Figures and colour maps, turned into Rich text off the UI thread.
"""

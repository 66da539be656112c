"""Screens: the opening frame, the explorer, the timeline mode, dialogs and the palette.
"""

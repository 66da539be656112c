"""What every part of the UI shares: messages, the engine protocol, labels, settings,
keys and colour modes. No widgets.
"""

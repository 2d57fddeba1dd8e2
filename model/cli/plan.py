"""Placeholder until this command group lands."""


def register(app):
    return None

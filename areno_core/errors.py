"""Errors a user can fix. The CLI prints their message without a traceback."""

from __future__ import annotations


class ArenoError(Exception):
    """Base class for every error caused by user input or environment, not by a bug."""


class ConfigError(ArenoError, ValueError):
    """A run option or config file value is invalid."""


class NotAvailableError(ArenoError):
    """A flag or capability exists in the CLI but is not available in this build or machine."""


class PluginError(ArenoError):
    """A plugin registered something invalid, or two plugins registered the same name."""


class DatasetError(ArenoError, ValueError):
    """A dataset could not be loaded or a row does not match the algorithm's schema."""


class UserCodeError(ArenoError):
    """A user-supplied Python file (loader, reward, agent) could not be loaded."""

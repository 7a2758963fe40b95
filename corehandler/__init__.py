"""corehandler: keeps every crash of a fleet without holding the crashed process hostage."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("corehandler")
except PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0"

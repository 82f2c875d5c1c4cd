"""FlashMLA's ``flash_mla.flash_mla_interface`` module path, served by :mod:`mlakit.flash_mla`."""

from mlakit.flash_mla import *  # noqa: F401,F403
from mlakit.flash_mla import __all__  # noqa: F401

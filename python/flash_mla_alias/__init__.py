"""``flash_mla``: an alias of :mod:`mlakit.flash_mla`, installed only on request
(``pip install . -C cmake.define.MLAKIT_FLASH_MLA_ALIAS=ON``, see docs/python.md), so that
code written for FlashMLA runs on mlakit unchanged. It takes the place of FlashMLA's own
``flash_mla`` package: do not install both."""

from mlakit.flash_mla import *  # noqa: F401,F403
from mlakit.flash_mla import __all__  # noqa: F401

MLAKIT_ALIAS = True

"""The system's Chromium for the tests that check pages in a real browser (``.ci/system.sh`` installs Debian's
``chromium``; browsers downloaded by test tools are not used)."""

from __future__ import annotations

import shutil

__all__ = ["CHROMIUM"]

#: The first Chromium build found on PATH, or None (the tests that need it skip, naming .ci/system.sh).
CHROMIUM = next((path for name in ("chromium", "chromium-headless-shell", "chromium-browser", "google-chrome")
                 if (path := shutil.which(name))), None)

"""Server-side message filters loaded by hub processes in the tests (by dotted path)."""

from __future__ import annotations

from typing import Any


class HeaderFilter:
    """Passes messages whose property ``type`` equals the subscription option ``want``."""

    def initialize(self, conf: dict[str, str]) -> HeaderFilter:
        return self

    def set_subscription_preferences(self, topic: bytes, subscriber_id: bytes, preferences: Any) -> HeaderFilter:
        self.want = preferences.options.get("want", b"")
        return self

    def test_message(self, message: Any) -> bool:
        return bool(message.properties.get("type") == self.want)

    def uninitialize(self) -> None:
        pass


class Exploding(HeaderFilter):
    """Raises on every message: the hub closes the subscription, never crashes."""

    def test_message(self, message: Any) -> bool:
        raise RuntimeError("boom")


class BadInit(HeaderFilter):
    def initialize(self, conf: dict[str, str]) -> HeaderFilter:
        raise RuntimeError("cannot initialize")

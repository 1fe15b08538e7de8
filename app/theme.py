"""Themes: System, Light and Dark, chosen in Settings and remembered (QSettings). Light and Dark
are explicit Fusion palettes, so they look the same on every desktop; System keeps the platform's
own. Code blocks in replies use a Pygments style that matches."""
from __future__ import annotations

from PySide6.QtCore import QSettings
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QApplication, QStyleFactory

THEMES = ("System", "Light", "Dark")
CODE_STYLE = {"Light": "default", "Dark": "monokai", "System": "default"}
_system_style: str | None = None
_system_palette: QPalette | None = None


def settings() -> QSettings:
    return QSettings("Mixdesk", "Mixdesk")


def saved() -> str:
    value = settings().value("theme", "System")
    return value if value in THEMES else "System"


def _dark() -> QPalette:
    p = QPalette()
    base, window, text = QColor(30, 31, 34), QColor(43, 45, 48), QColor(223, 225, 229)
    for role, colour in ((QPalette.Window, window), (QPalette.WindowText, text), (QPalette.Base, base),
                         (QPalette.AlternateBase, window), (QPalette.ToolTipBase, window),
                         (QPalette.ToolTipText, text), (QPalette.Text, text), (QPalette.Button, window),
                         (QPalette.ButtonText, text), (QPalette.BrightText, QColor(255, 90, 90)),
                         (QPalette.Link, QColor(110, 160, 255)), (QPalette.Highlight, QColor(53, 116, 240)),
                         (QPalette.HighlightedText, QColor(255, 255, 255)),
                         (QPalette.PlaceholderText, QColor(140, 143, 150))):
        p.setColor(role, colour)
    for role in (QPalette.WindowText, QPalette.Text, QPalette.ButtonText):
        p.setColor(QPalette.Disabled, role, QColor(120, 122, 128))
    return p


def apply(name: str, remember: bool = True) -> str:
    """Apply a theme to the running app; returns the Pygments style its code blocks use."""
    global _system_style, _system_palette
    app = QApplication.instance()
    if _system_style is None:
        _system_style, _system_palette = app.style().name(), QPalette(app.palette())
    if name == "System":
        app.setStyle(QStyleFactory.create(_system_style) or app.style())
        app.setPalette(_system_palette)
    else:
        app.setStyle(QStyleFactory.create("Fusion"))
        app.setPalette(_dark() if name == "Dark" else app.style().standardPalette())
    if remember:
        settings().setValue("theme", name)
    return CODE_STYLE[name] if name != "System" or not is_dark(app.palette()) else "monokai"


def is_dark(palette: QPalette) -> bool:
    return palette.color(QPalette.Window).lightness() < 128

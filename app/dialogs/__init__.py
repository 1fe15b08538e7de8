"""The window's dialogs: opening a model (model_picker.py, model_browser.py and hub_search.py, its work
without Qt), the context a model runs at (context_choice.py), chat settings (chat_settings.py), the
lowest precision for experts (lowest_precision.py), keyboard shortcuts (shortcuts_help.py) and the log
(log_view.py).
"""

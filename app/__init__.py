"""The desktop window (PySide6 + qasync). It reaches the engine only through the engine's commands and
events (bridge.py, engine_controller.py). Folders: chat/ (the conversation, its view and composer),
panel/ (the live panel and the slider), dialogs/ (opening a model and the settings' dialogs), store/
(the chats on disk, no Qt). At the top: the window and its wiring (main_window.py, window_wiring.py,
window_state.py, menus.py), the model bar and switching models, the GPU runtime's offer, serving, the
self-test and the `mixdesk` entry point.
"""
